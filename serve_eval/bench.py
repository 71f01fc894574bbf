"""`python -m serve_eval.bench`: speculative vs verifier-only wall time, and our AR loop vs HF assisted
generation, on the same prompts in one process (greedy).

Uses the demo artifacts (verifier, corpus test prompts, trained drafters) when they exist; otherwise
random tiny models, and says so.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

import torch
from rich.table import Table
from transformers import Qwen3Config, Qwen3ForCausalLM

from pipeline.cli import run_stage, stage_parser
from pipeline.config.sampling_config import SamplingConfig
from pipeline.config.train_config import TrainConfig
from pipeline.drafters.ar.decoding import ARProposer, TorchARDrafter
from pipeline.drafters.block.decoding import BlockDrafter, BlockProposer
from pipeline.drafters.block.model import DFlashConfig, DFlashDraftModel
from pipeline.errors import DraftlineError
from pipeline.integrity import stop_token_ids
from pipeline.paths import ArtifactPaths
from pipeline.progress import console, info
from serve_eval.evaluate import EvaluateParams, evaluate_cell
from serve_eval.loading import load_drafters, load_test_prompts, load_verifier_for_decoding


class BenchParams(EvaluateParams):
    train: TrainConfig = TrainConfig()


def demo_setup(params: BenchParams, per_domain: int):
    paths = ArtifactPaths.from_params(params)
    verifier, tokenizer = load_verifier_for_decoding(paths, params.verifier)
    prompts = [p for domain in load_test_prompts(paths, per_domain, verifier.config.vocab_size).values() for p in domain]
    kinds = [kind for kind in params.evaluate.drafters if (paths.drafter(kind) / "config.json").exists()]
    if not kinds:
        raise DraftlineError("no trained drafter")
    config = params.evaluate.model_copy(update={"drafters": kinds, "backend": "torch"})
    proposers = {kind: (drafter.proposer, drafter.peer_model)
                 for kind, drafter in load_drafters(paths, config, verifier, tokenizer).items()}
    return verifier, stop_token_ids(verifier.generation_config, tokenizer), prompts, proposers


def random_setup(params: BenchParams, count: int):
    torch.manual_seed(params.evaluate.seed)

    def qwen3(layers: int) -> Qwen3ForCausalLM:
        config = Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16)
        return Qwen3ForCausalLM(config).eval()

    verifier, drafter = qwen3(4), qwen3(1)
    block = DFlashDraftModel(DFlashConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
        vocab_size=512, block_size=params.train.block.block_size, num_target_layers=4,
        dflash_config={"mask_token_id": 1, "target_layer_ids": [0, 3]})).eval()
    prompts = torch.randint(3, 512, (count, 24)).tolist()
    proposers = {"ar": (ARProposer(TorchARDrafter(drafter), params.train.ar.draft_tokens), drafter),
                 "block": (BlockProposer(BlockDrafter(block, verifier, params.evaluate.denoise_steps)), None)}
    return verifier, [], prompts, proposers


def run(params: BenchParams, args: argparse.Namespace) -> None:
    try:
        verifier, eos, prompts, proposers = demo_setup(params, args.prompts)
        info(f"bench on the demo artifacts: {len(prompts)} test prompts, drafters {sorted(proposers)}")
    except DraftlineError as missing:
        info(f"bench on RANDOM tiny models (demo artifacts unavailable: {missing})")
        verifier, eos, prompts, proposers = random_setup(params, 2 * args.prompts)
    table = Table(title=f"bench: greedy, {args.max_new_tokens} new tokens, wall time summed over prompts",
                  title_justify="left")
    for column in ("drafter", "verifier only s", "speculative s", "speedup", "tau", "HF assisted s",
                   "ours vs HF"):
        table.add_column(column)
    for kind, (proposer, peer) in proposers.items():
        tally = evaluate_cell(verifier, proposer, prompts, SamplingConfig(), max_new_tokens=args.max_new_tokens,
                              eos_token_id=eos, seed=0, desc=f"bench {kind}", peer_drafter=peer,
                              draft_tokens=proposer.draft_tokens if peer is not None else 0)
        metrics = tally.metrics()
        table.add_row(kind, f"{tally.base_s:.3f}", f"{tally.spec_s:.3f}", f"{metrics['speedup']:.2f}x",
                      f"{metrics['tau']:.2f}", f"{tally.peer_s:.3f}" if peer is not None else "-",
                      f"{metrics['ours_vs_hf_assisted']:.2f}x" if peer is not None else "-")
        if tally.mismatches:
            info(f"[red]{kind}: {tally.mismatches} prompt(s) differ from verifier-only greedy output[/]")
    console.print(table)
    info("speedup = verifier-only time / speculative time (tokens/s ratio); ours vs HF = HF time / ours; "
         "tau = tokens per verifier forward, bonus included")


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("python -m serve_eval.bench", __doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8, help="test prompts per domain (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    return run_stage(parser, BenchParams, run, argv)


if __name__ == "__main__":
    sys.exit(main())
