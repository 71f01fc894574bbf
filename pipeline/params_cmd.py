"""`draftline params check|show`: validate params.yaml without running anything, or print every effective
value (the file's, and the schema defaults it leaves out) as YAML."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import yaml

from pipeline.cli import run_stage, stage_parser
from pipeline.config.base import DRAFTER_NAMES
from pipeline.config.schema import Params
from pipeline.drafters.block.config import BlockFamilyConfig, learned_mask_warning
from pipeline.progress import warn


def _run(params: Params, args: argparse.Namespace) -> None:
    if args.action == "show":
        print(yaml.safe_dump(params.model_dump(mode="json"), sort_keys=False), end="")
        return
    for where in params.project.dirs_outside(Path.cwd()):
        warn(f"{where} is outside the project directory (allowed; check it is meant)")
    for section in (getattr(params.train, name) for name in DRAFTER_NAMES):
        if isinstance(section, BlockFamilyConfig) and section.mask == "learned":
            warn(learned_mask_warning(section.kind))
    print(f"{args.params}: ok (params hash {params.section_hash()})")


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("draftline params", "Validate params.yaml against the typed schema, or show every effective value.")
    parser.add_argument("action", choices=["check", "show"])
    return run_stage(parser, Params, _run, argv)


if __name__ == "__main__":
    sys.exit(main())
