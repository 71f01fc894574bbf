"""The `draftline` command: one subcommand per stage, plus `params check`, `generate` and `registry`.

Each stage module owns its argument parser and exposes `main(argv)`; this file only dispatches, so
`draftline --help` stays fast and every stage also runs as `python -m <package>.<stage>`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import math
import os
import sys
from typing import Callable, Sequence

from pipeline.config import DEFAULT_PARAMS_PATH, Params, load_params
from pipeline.errors import DraftlineError

# subcommand -> (module with main(argv), one-line description)
COMMANDS: dict[str, tuple[str, str]] = {
    "params": ("pipeline.params_cmd", "validate params.yaml (`draftline params check`)"),
    "bootstrap_verifier": ("data_prep.bootstrap_verifier", "train the offline demo verifier, or record an external one"),
    "build_corpus": ("data_prep.build_corpus", "regenerate responses with the verifier into the corpus"),
    "train": ("train.stage", "distill a drafter (`--drafter ar|block`)"),
    "export": ("export.stage", "serving checkpoints, ONNX with parity, TensorRT engines"),
    "evaluate": ("serve_eval.evaluate", "speculative decoding evaluation on the corpus test split"),
    "promote": ("pipeline.promote", "register evaluated drafters in MLflow and run the promotion gate"),
    "generate": ("serve_eval.generate", "one speculative generation with accepted tokens highlighted"),
    "registry": ("pipeline.registry_cli", "inspect the MLflow registry and promote by hand"),
}


def report_error(error: BaseException) -> int:
    code = getattr(error, "exit_code", 1)
    print(f"draftline: error: {error}", file=sys.stderr)
    return code


def temperature_arg(text: str) -> float:
    """argparse type: a sampling temperature in [0, 5] (nan/inf/negative are usage errors, not tracebacks)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or not 0.0 <= value <= 5.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 5], got {text}")
    return value


def positive_int_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def stage_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "--params", default=str(DEFAULT_PARAMS_PATH), help="path to params.yaml (default: %(default)s)"
    )
    return parser


def run_stage(
    parser: argparse.ArgumentParser,
    run: Callable[[Params, argparse.Namespace], object],
    argv: Sequence[str] | None = None,
) -> int:
    """Parse args, load and validate params, run; user errors become one line and a non-zero exit."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = parser.parse_args(argv)
    try:
        params = load_params(args.params)
        run(params, args)
    except DraftlineError as error:
        return report_error(error)
    except KeyboardInterrupt:
        print("draftline: interrupted", file=sys.stderr)
        return 130
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="draftline",
        description="Train, export, evaluate and promote speculative-decoding drafters.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n" + "\n".join(f"  {name:<20} {text}" for name, (_, text) in COMMANDS.items()),
    )
    parser.add_argument("command", choices=sorted(COMMANDS), metavar="command", help="one of the commands below")
    if argv[:1] in (["--version"], ["-V"]):
        print(f"draftline {importlib.metadata.version('draftline')}")
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        parser.parse_args(argv[:1])  # argparse prints the usage error and exits 2
    module_name, _ = COMMANDS[argv[0]]
    module = importlib.import_module(module_name)
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
