"""`draftline params check`: validate params.yaml without running anything."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from pipeline.cli import run_stage, stage_parser
from pipeline.config.schema import Params
from pipeline.drafters.block.config import LEARNED_MASK_WARNING
from pipeline.progress import warn


def _check(params: Params, args: argparse.Namespace) -> None:
    for where in params.project.dirs_outside(Path.cwd()):
        warn(f"{where} is outside the project directory (allowed; check it is meant)")
    if params.train.block.mask == "learned":
        warn(LEARNED_MASK_WARNING)
    print(f"{args.params}: ok (params hash {params.section_hash()})")


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("draftline params", "Validate params.yaml against the typed schema.")
    parser.add_argument("action", choices=["check"])
    return run_stage(parser, Params, _check, argv)


if __name__ == "__main__":
    sys.exit(main())
