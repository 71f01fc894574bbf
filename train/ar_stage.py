"""Stage `train_ar`: distill the AR drafter from the verifier on the corpus.

Writes `artifacts/drafters/ar/` (HF causal LM + tokenizer + training.json) and `metrics/train_ar.json`;
Lightning checkpoints live in `artifacts/checkpoints/ar/` so a killed run resumes where it stopped.
Every process of a multi-process launch runs this code; only rank 0 evaluates and writes outputs.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

import torch

from data_prep.corpus import corpus_hash, load_corpus
from data_prep.verifier import load_verifier, verifier_identity
from pipeline.atomic import write_json_atomic
from pipeline.cli import run_stage, stage_parser
from pipeline.config import Params
from pipeline.lineage import git_commit
from pipeline.paths import ArtifactPaths
from pipeline.progress import info, print_summary
from train.ar_data import ARDataModule
from train.ar_lit import ARDistillModule, evaluate_agreement
from train.ar_model import build_ar_drafter, check_same_vocabulary
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

KIND = "ar"


def run(params: Params, args: argparse.Namespace | None = None) -> dict | None:
    """Train and save the AR drafter; returns training.json's content on rank 0 (None elsewhere)."""
    started = time.perf_counter()
    cfg, tcfg = params.train.ar, params.train.ar.trainer
    paths = ArtifactPaths.from_params(params)
    verifier, tokenizer = load_verifier(paths, params.verifier.dtype)
    corpus = load_corpus(paths)
    identity, data_hash = verifier_identity(paths), corpus_hash(paths)
    draft_tokens = params.evaluate.ar_draft_tokens

    drafter = build_ar_drafter(cfg, verifier, tokenizer, seed=params.project.seed)
    check_same_vocabulary(drafter, verifier, "AR drafter")
    data = ARDataModule(
        corpus, pad_id=tokenizer.pad_token_id, max_len=tcfg.max_seq_len, batch_size=tcfg.batch_size,
        seed=params.project.seed, num_workers=tcfg.num_workers,
    )
    teacher = FrozenVerifier(verifier)
    untrained = evaluate_agreement(drafter, teacher, data.val_set, cfg.loss, draft_tokens) if is_rank_zero() else None

    fingerprint = {"train.ar": cfg.model_dump(mode="json"), "verifier": identity["hash"], "corpus": data_hash}
    resume = resume_checkpoint(paths.checkpoints(KIND), fingerprint)
    if resume and is_rank_zero():
        info(f"resuming from {resume}")
    logger = make_mlflow_logger(params, KIND)
    module = ARDistillModule(drafter, verifier, cfg.loss, tcfg, draft_tokens)
    trainer = build_trainer(tcfg, checkpoint_dir=paths.checkpoints(KIND), logger=logger)
    trainer.fit(module, datamodule=data, ckpt_path=resume)

    state = full_state_dict(module.drafter, trainer)  # collective under ZeRO-3: every rank gathers
    tokens = int(trainer.strategy.reduce(torch.tensor(float(module.tokens_seen)), reduce_op="sum").item())
    if not is_rank_zero():
        return None

    # A fresh copy from the gathered weights: under ZeRO the trained module's tensors are partitioned.
    final = drafter.__class__(drafter.config)
    final.load_state_dict(state)
    final.to(module.device if module.device.type == "cuda" else "cpu").eval()
    trained = evaluate_agreement(final, teacher, data.val_set, cfg.loss, draft_tokens)
    train_loss = trainer.callback_metrics.get("train/loss")
    training_info = {
        "kind": KIND,
        "steps": trainer.global_step,
        "tokens": tokens,
        "train_loss": float(train_loss) if train_loss is not None else None,
        "val_loss": trained["loss"],
        "top1_agreement": trained["top1_agreement"],
        "simulated_acceptance_length": trained["simulated_acceptance_length"],
        "token_top1_agreement": trained["token_top1_agreement"],
        "untrained_top1_agreement": untrained["top1_agreement"],
        "untrained_simulated_acceptance_length": untrained["simulated_acceptance_length"],
        "untrained_token_top1_agreement": untrained["token_top1_agreement"],
        "untrained_val_loss": untrained["loss"],
        "draft_tokens": draft_tokens,
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
    logger.log_hyperparams(flatten("train.ar", cfg.model_dump(mode="json")))
    logger.log_metrics(
        {
            "final/val_loss": trained["loss"],
            "final/token_top1_agreement": trained["token_top1_agreement"],
            "final/simulated_acceptance_length": trained["simulated_acceptance_length"],
            "final/untrained_token_top1_agreement": untrained["token_top1_agreement"],
        },
        step=trainer.global_step,
    )

    def write_model(directory):
        final.to("cpu").save_pretrained(directory)
        tokenizer.save_pretrained(directory)

    saved = save_drafter_atomic(paths.drafter(KIND), write_model, training_info, logger)
    metrics = {key: saved[key] for key in ("steps", "tokens", "train_loss", "val_loss", "simulated_acceptance_length",
                                           "token_top1_agreement", "untrained_token_top1_agreement")}
    metrics["wall_time_s"] = round(time.perf_counter() - started, 1)
    write_json_atomic(paths.metrics / "train_ar.json", metrics)
    print_summary("train_ar", {**metrics, "drafter": str(paths.drafter(KIND)),
                               "top1 per position": ", ".join(f"{r:.3f}" for r in saved["top1_agreement"]),
                               "untrained top1 per position": ", ".join(f"{r:.3f}" for r in saved["untrained_top1_agreement"])})
    return saved


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("draftline train --drafter ar", "distill the autoregressive drafter (stage train_ar)")
    return run_stage(parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
