"""Stage `train_block`: train the DFlash-style block drafter against the verifier on the corpus.

Writes `artifacts/drafters/block/` (DFlash layout: config.json + safetensors with `layers.*`, `fc`,
`hidden_norm`, `norm`; tokenizer files; training.json) and `metrics/train_block.json`; Lightning
checkpoints live in `artifacts/checkpoints/block/` so a killed run resumes where it stopped.
Every process of a multi-process launch runs this code; only rank 0 evaluates and writes outputs.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

import torch

from data_prep.corpus import corpus_hash, load_corpus
from data_prep.verifier import load_verifier, mask_token_id, verifier_identity
from pipeline.atomic import write_json_atomic
from pipeline.cli import run_stage, stage_parser
from pipeline.config import Params
from pipeline.lineage import git_commit
from pipeline.paths import ArtifactPaths
from pipeline.progress import info, print_summary
from train.block_data import BlockDataModule
from train.block_lit import BlockDistillModule, build_block_drafter, evaluate_blocks
from train.block_model import DFlashDraftModel
from train.frozen import FrozenVerifier
from train.trainer import (
    build_trainer,
    flatten,
    full_state_dict,
    is_rank_zero,
    make_mlflow_logger,
    resume_checkpoint,
    save_drafter_atomic,
)

KIND = "block"


def run(params: Params, args: argparse.Namespace | None = None) -> dict | None:
    """Train and save the block drafter; returns training.json's content on rank 0 (None elsewhere)."""
    started = time.perf_counter()
    cfg, tcfg, seed = params.train.block, params.train.block.trainer, params.project.seed
    paths = ArtifactPaths.from_params(params)
    verifier, tokenizer = load_verifier(paths, params.verifier.dtype)
    corpus = load_corpus(paths)
    identity, data_hash = verifier_identity(paths), corpus_hash(paths)

    drafter = build_block_drafter(verifier, cfg, mask_token_id(tokenizer), seed)
    data = BlockDataModule(
        corpus, pad_id=tokenizer.pad_token_id, max_len=tcfg.max_seq_len, batch_size=tcfg.batch_size,
        seed=seed, num_workers=tcfg.num_workers,
    )
    teacher = FrozenVerifier(verifier)
    untrained = evaluate_blocks(drafter, teacher, data.val_set, cfg, seed) if is_rank_zero() else None

    fingerprint = {"train.block": cfg.model_dump(mode="json"), "verifier": identity["hash"], "corpus": data_hash,
                   "seed": seed}
    resume = resume_checkpoint(paths.checkpoints(KIND), fingerprint)
    if resume and is_rank_zero():
        info(f"resuming from {resume}")
    logger = make_mlflow_logger(params, KIND)
    module = BlockDistillModule(drafter, verifier, cfg, tcfg, seed)
    trainer = build_trainer(tcfg, checkpoint_dir=paths.checkpoints(KIND), logger=logger)
    trainer.fit(module, datamodule=data, ckpt_path=resume)

    state = full_state_dict(module.drafter, trainer)  # collective under ZeRO-3: every rank gathers
    tokens = int(trainer.strategy.reduce(torch.tensor(float(module.tokens_seen)), reduce_op="sum").item())
    if not is_rank_zero():
        return None

    # A fresh copy from the gathered weights: under ZeRO the trained module's tensors are partitioned.
    final = DFlashDraftModel(drafter.config)
    final.load_state_dict(state)
    final.eval()
    trained = evaluate_blocks(final, teacher, data.val_set, cfg, seed)
    train_loss = trainer.callback_metrics.get("train/loss")
    training_info = {
        "kind": KIND,
        "steps": trainer.global_step,
        "tokens": tokens,
        "train_loss": float(train_loss) if train_loss is not None else None,
        "val_loss": trained["loss"],
        "top1_agreement": trained["top1_agreement"],
        "position_top1_agreement": trained["position_top1_agreement"],
        "simulated_acceptance_length": trained["simulated_acceptance_length"],
        "untrained_top1_agreement": untrained["top1_agreement"],
        "untrained_position_top1_agreement": untrained["position_top1_agreement"],
        "untrained_simulated_acceptance_length": untrained["simulated_acceptance_length"],
        "untrained_val_loss": untrained["loss"],
        "block_size": final.block_size,
        "target_layer_ids": final.config.target_layer_ids,
        "mask_mode": final.config.mask_mode,
        "strategy": tcfg.strategy,
        "world_size": trainer.world_size,
        "lineage": {
            "verifier_id": identity["id"],
            "verifier_hash": identity["hash"],
            "corpus_hash": data_hash,
            "params_hash": params.section_hash("train"),
            "git_commit": git_commit(),
        },
    }
    logger.log_hyperparams(flatten("train.block", cfg.model_dump(mode="json")))
    logger.log_metrics(
        {
            "final/val_loss": trained["loss"],
            "final/simulated_acceptance_length": trained["simulated_acceptance_length"],
            "final/untrained_simulated_acceptance_length": untrained["simulated_acceptance_length"],
        },
        step=trainer.global_step,
    )

    def write_model(directory):
        final.save_pretrained(directory)
        tokenizer.save_pretrained(directory)

    saved = save_drafter_atomic(paths.drafter(KIND), write_model, training_info, logger)
    metrics = {key: saved[key] for key in ("steps", "tokens", "train_loss", "val_loss", "untrained_val_loss",
                                           "simulated_acceptance_length", "untrained_simulated_acceptance_length")}
    metrics["wall_time_s"] = round(time.perf_counter() - started, 1)
    write_json_atomic(paths.metrics / "train_block.json", metrics)
    print_summary("train_block", {
        **metrics, "drafter": str(paths.drafter(KIND)),
        "top1 per position": ", ".join(f"{r:.3f}" for r in saved["position_top1_agreement"]),
        "untrained top1 per position": ", ".join(f"{r:.3f}" for r in saved["untrained_position_top1_agreement"]),
    })
    return saved


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("draftline train --drafter block", "train the block-diffusion drafter (stage train_block)")
    return run_stage(parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
