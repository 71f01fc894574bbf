"""Stage `train_eagle3`: train the EAGLE-3 head against the verifier on the corpus.

Writes `artifacts/drafters/eagle3/` (config.json + safetensors with `fc`, `midlayer.*`, `norm`,
`lm_head` and, with a reduced draft vocabulary, `d2t`/`t2d`; tokenizer files; training.json) and
`metrics/train_eagle3.json`; Lightning checkpoints live in `artifacts/checkpoints/eagle3/` so a killed
run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from pipeline.cli import run_stage, stage_parser
from pipeline.drafters.eagle3.model import build_drafter
from train.block_data import BlockDataModule
from train.distill import DrafterRecipe, distill
from train.eagle3_lit import Eagle3DistillModule, evaluate_head
from train.train_params import TrainParams


def eagle3_recipe(params: TrainParams, verifier, tokenizer, corpus) -> DrafterRecipe:
    cfg, tcfg, seed = params.train.eagle3, params.train.eagle3.trainer, params.project.seed
    train_rows = corpus["train"]
    # the draft vocabulary (when reduced) is the training split's most frequent tokens
    sequences = (prompt + response for prompt, response in zip(train_rows["prompt_ids"], train_rows["response_ids"]))
    drafter = build_drafter(verifier, cfg, sequences, seed)
    data = BlockDataModule(corpus, pad_id=tokenizer.pad_token_id, max_len=tcfg.max_seq_len,
                           batch_size=tcfg.batch_size, seed=seed, num_workers=tcfg.num_workers)
    return DrafterRecipe(
        kind="eagle3", config=cfg, trainer_config=tcfg, drafter=drafter, data=data,
        make_module=lambda: Eagle3DistillModule(drafter, verifier, cfg, tcfg, val_rows=data.val_set.rows),
        evaluate=lambda model, teacher: evaluate_head(model, teacher, data.val_set, cfg),
        agreement_keys=("top1_agreement", "position_top1_agreement", "simulated_acceptance_length",
                        "decode_tau", "decode_tau_no_prefill", "decode_acceptance"),
        per_position_key="position_top1_agreement",
        extra_info={
            "draft_tokens": cfg.draft_tokens,
            "ttt_steps": cfg.ttt_steps,
            "aux_layer_ids": drafter.config.eagle_aux_hidden_state_layer_ids,
            "draft_vocab_size": drafter.config.draft_vocab_size,
        },
    )


def run(params: TrainParams, args: argparse.Namespace | None = None) -> dict | None:
    """Train and save the EAGLE-3 head; returns training.json's content on rank 0 (None elsewhere)."""
    return distill(params, eagle3_recipe)


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("draftline train --drafter eagle3", "train the EAGLE-3 head (stage train_eagle3)")
    return run_stage(parser, TrainParams, run, argv)


if __name__ == "__main__":
    sys.exit(main())
