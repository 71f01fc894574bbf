"""Training benchmarks.

`python -m train.bench [--params params.yaml] [--steps 40]`: throughput of the AR drafter, `auto` vs
`deepspeed_stage_2` on CPU, one process. Same verifier, corpus, drafter shape, batches and step count
for both; tokens/s counts every (non-padding) token the drafter trains on, measured after warm-up steps.

`python -m train.bench --block-ablation [--steps 300]`: what each block-drafter training choice
contributes (train/block_bench.py).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from lightning.pytorch import Callback

from data_prep.corpus import load_corpus
from data_prep.verifier import load_verifier
from pipeline.cli import run_bench, stage_parser
from pipeline.drafters.ar.lightning import ARDistillModule
from pipeline.drafters.ar.model import build_drafter
from pipeline.paths import ArtifactPaths
from pipeline.progress import print_summary
from pipeline.training.corpus_data import NextTokenDataModule
from pipeline.training.frozen import FrozenVerifier
from pipeline.training.params import TrainParams
from train.trainer import build_trainer

STRATEGIES = ("auto", "deepspeed_stage_2")


class ThroughputMeter(Callback):
    """Tokens and wall time of training batches after the first `warmup` ones."""

    def __init__(self, warmup: int):
        self.warmup = warmup
        self.tokens = 0
        self.started: float | None = None
        self.elapsed = 0.0

    def on_train_batch_start(self, trainer, module, batch, batch_index) -> None:
        if trainer.global_step == self.warmup:
            self.started = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_index) -> None:
        if self.started is not None:
            self.tokens += int(batch["attention_mask"].sum().item())
            self.elapsed = time.perf_counter() - self.started

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed if self.elapsed else 0.0


def measure(params: TrainParams, strategy: str, steps: int, warmup: int) -> float:
    cfg = params.train.ar
    tcfg = cfg.trainer.model_copy(update={
        "strategy": strategy, "devices": 1, "num_nodes": 1, "accelerator": "cpu", "max_steps": steps + warmup,
        "val_every_n_steps": 10 * (steps + warmup), "checkpoint_every_n_steps": 10 * (steps + warmup),
        "offload_optimizer": False, "offload_parameters": False,
    })
    paths = ArtifactPaths.from_params(params)
    verifier, tokenizer = load_verifier(paths, params.verifier.dtype, params.verifier.trust_remote_code,
                                       params.verifier.allow_pickle_weights)
    drafter = build_drafter(verifier, cfg, tokenizer, seed=params.project.seed)
    data = NextTokenDataModule(load_corpus(paths), pad_id=tokenizer.pad_token_id, max_len=tcfg.max_seq_len,
                        batch_size=tcfg.batch_size, seed=params.project.seed)
    meter = ThroughputMeter(warmup)
    with tempfile.TemporaryDirectory(prefix="draftline-bench-") as scratch:
        trainer = build_trainer(tcfg, checkpoint_dir=Path(scratch), callbacks=[meter], enable_progress_bar=False,
                                limit_val_batches=0)
        trainer.fit(ARDistillModule(drafter, FrozenVerifier(verifier), cfg.loss, tcfg, params.train.ar.draft_tokens),
                    datamodule=data)
    return meter.tokens_per_s


def run(params: TrainParams, args: argparse.Namespace) -> dict:
    if args.block_ablation:
        from train.block_bench import ablation

        return ablation(params, args.steps or 300, args.variants)
    args.steps = args.steps or 40
    results = {strategy: measure(params, strategy, args.steps, args.warmup) for strategy in STRATEGIES}
    ratio = results["deepspeed_stage_2"] / results["auto"] if results["auto"] else float("nan")
    rows = {f"{name} tokens/s": value for name, value in results.items()}
    rows["deepspeed_stage_2 / auto"] = ratio
    print_summary(f"AR drafter training throughput on CPU ({args.steps} steps after {args.warmup} warm-up)", rows)
    print(f"tokens/s auto={results['auto']:.1f} deepspeed_stage_2={results['deepspeed_stage_2']:.1f} ratio={ratio:.3f}")
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("python -m train.bench",
                          "training throughput (auto vs deepspeed_stage_2) or the block-drafter ablation")
    parser.add_argument("--steps", type=int, default=None,
                        help="measured steps per strategy (default 40); training steps per ablation variant (default 300)")
    parser.add_argument("--block-ablation", action="store_true", help="ablate the block drafter's training choices")
    parser.add_argument("--variants", nargs="*", default=None, help="with --block-ablation: only these variants")
    parser.add_argument("--warmup", type=int, default=5, help="unmeasured steps first")
    return run_bench(parser, TrainParams, run, argv)


if __name__ == "__main__":
    sys.exit(main())
