"""Stage `train_ar`: distill the AR drafter from the verifier on the corpus.

Writes `artifacts/drafters/ar/` (HF causal LM + tokenizer + training.json) and `metrics/train_ar.json`;
Lightning checkpoints live in `artifacts/checkpoints/ar/` so a killed run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from pipeline.cli import run_stage, stage_parser
from pipeline.drafters.ar.model import build_drafter, check_same_vocabulary
from train.ar_lit import ARDistillModule, evaluate_agreement
from train.corpus_data import ARDataModule
from train.distill import DrafterRecipe, distill
from train.train_params import TrainParams
from train.trainer import resolve_budget


def ar_recipe(params: TrainParams, verifier, tokenizer, corpus) -> DrafterRecipe:
    cfg = params.train.ar
    tcfg = resolve_budget(cfg.trainer, len(corpus["train"]))
    draft_tokens = cfg.draft_tokens
    drafter = build_drafter(verifier, cfg, tokenizer, seed=params.project.seed)
    check_same_vocabulary(drafter, verifier, "AR drafter")
    data = ARDataModule(
        corpus, pad_id=tokenizer.pad_token_id, max_len=tcfg.max_seq_len, batch_size=tcfg.batch_size,
        seed=params.project.seed, num_workers=tcfg.num_workers,
    )
    return DrafterRecipe(
        kind="ar", config=cfg, trainer_config=tcfg, drafter=drafter, data=data,
        make_module=lambda: ARDistillModule(drafter, verifier, cfg.loss, tcfg, draft_tokens),
        evaluate=lambda model, teacher: evaluate_agreement(model, teacher, data.val_set, cfg.loss, draft_tokens),
        agreement_keys=("top1_agreement", "simulated_acceptance_length", "token_top1_agreement"),
        per_position_key="top1_agreement",
        extra_info={"draft_tokens": draft_tokens},
    )


def run(params: TrainParams, args: argparse.Namespace | None = None) -> dict | None:
    """Train and save the AR drafter; returns training.json's content on rank 0 (None elsewhere)."""
    return distill(params, ar_recipe)


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("draftline train --drafter ar", "distill the autoregressive drafter (stage train_ar)")
    return run_stage(parser, TrainParams, run, argv)


if __name__ == "__main__":
    sys.exit(main())
