"""`draftline train --drafter ar|block`: dispatch to the drafter's stage (stages `train_ar`, `train_block`)."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from pipeline.cli import run_stage, stage_parser
from pipeline.config.base import DRAFTER_NAMES
from pipeline.drafters.kinds import KINDS
from train.train_params import TrainParams


def run(params: TrainParams, args: argparse.Namespace) -> object:
    module = importlib.import_module(KINDS[args.drafter].train_stage)
    return module.run(params, args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("draftline train", "distill a drafter from the verifier on the corpus")
    parser.add_argument("--drafter", choices=DRAFTER_NAMES, required=True, help="which drafter to train")
    return run_stage(parser, TrainParams, run, argv)


if __name__ == "__main__":
    sys.exit(main())
