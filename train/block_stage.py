"""Stage `train_block`: train the DFlash-style block drafter against the verifier on the corpus.

Writes `artifacts/drafters/block/` (DFlash layout: config.json + safetensors with `layers.*`, `fc`,
`hidden_norm`, `norm`; tokenizer files; training.json) and `metrics/train_block.json`; Lightning
checkpoints live in `artifacts/checkpoints/block/` so a killed run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from data_prep.verifier import mask_token_id
from pipeline.cli import run_stage, stage_parser
from pipeline.config import Params
from train.block_data import BlockDataModule
from train.block_lit import BlockDistillModule, build_block_drafter, evaluate_blocks
from train.distill import DrafterRecipe, distill


def block_recipe(params: Params, verifier, tokenizer, corpus) -> DrafterRecipe:
    cfg, tcfg, seed = params.train.block, params.train.block.trainer, params.project.seed
    drafter = build_block_drafter(verifier, cfg, mask_token_id(tokenizer), seed)
    data = BlockDataModule(
        corpus, pad_id=tokenizer.pad_token_id, max_len=tcfg.max_seq_len, batch_size=tcfg.batch_size,
        seed=seed, num_workers=tcfg.num_workers,
    )
    return DrafterRecipe(
        kind="block", config=cfg, trainer_config=tcfg, drafter=drafter, data=data,
        make_module=lambda: BlockDistillModule(drafter, verifier, cfg, tcfg, seed),
        evaluate=lambda model, teacher: evaluate_blocks(model, teacher, data.val_set, cfg, seed),
        agreement_keys=("top1_agreement", "position_top1_agreement", "simulated_acceptance_length"),
        per_position_key="position_top1_agreement",
        extra_info={
            "block_size": drafter.block_size,
            "target_layer_ids": drafter.config.target_layer_ids,
            "mask_mode": drafter.config.mask_mode,
        },
    )


def run(params: Params, args: argparse.Namespace | None = None) -> dict | None:
    """Train and save the block drafter; returns training.json's content on rank 0 (None elsewhere)."""
    return distill(params, block_recipe)


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("draftline train --drafter block", "train the block-diffusion drafter (stage train_block)")
    return run_stage(parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
