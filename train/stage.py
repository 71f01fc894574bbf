"""`draftline train --drafter ar|block`: dispatch to the drafter's stage (stages `train_ar`, `train_block`)."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from pipeline.cli import run_stage, stage_parser
from pipeline.config import Params

STAGE_MODULES = {"ar": "train.ar_stage", "block": "train.block_stage"}


def run(params: Params, args: argparse.Namespace) -> object:
    # Imported lazily: each drafter's stage pulls in only its own model code.
    module = importlib.import_module(STAGE_MODULES[args.drafter])
    return module.run(params, args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("draftline train", "distill a drafter from the verifier on the corpus")
    parser.add_argument("--drafter", choices=sorted(STAGE_MODULES), required=True, help="which drafter to train")
    return run_stage(parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
