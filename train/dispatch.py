"""`draftline train --drafter <kind>` (stage `train_<kind>`): train any kind from its recipe
(`pipeline/drafters/<kind>/training.py`) through the shared training flow (train/distill.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from pipeline.cli import run_stage, stage_parser
from pipeline.config.base import DRAFTER_NAMES
from pipeline.training.params import TrainParams
from train.distill import distill


def train(params: TrainParams, kind: str) -> dict | None:
    """Train and save drafter `kind`; returns training.json's content on rank 0 (None elsewhere)."""
    return distill(params, kind)


def run(params: TrainParams, args: argparse.Namespace) -> dict | None:
    return train(params, args.drafter)


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("draftline train", "distill a drafter from the verifier on the corpus")
    parser.add_argument("--drafter", choices=DRAFTER_NAMES, required=True, help="which drafter to train (stage train_<kind>)")
    return run_stage(parser, TrainParams, run, argv)


if __name__ == "__main__":
    sys.exit(main())
