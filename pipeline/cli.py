"""The `draftline` command: one subcommand per stage, plus `params check`, `generate`, `registry` and `timings`.

Each stage module owns its argument parser and exposes `main(argv)`; this file only dispatches, so
`draftline --help` stays fast and every stage also runs as `python -m <package>.<stage>`.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import importlib.metadata
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

from pipeline.config.base import DEFAULT_PARAMS_PATH, DRAFTER_NAMES
from pipeline.config.loader import Schema, load_params
from pipeline.errors import DraftlineError, Terminated, describe_os_error

# subcommand -> (module with main(argv), one-line description)
COMMANDS: dict[str, tuple[str, str]] = {
    "params": ("pipeline.params_cmd", "validate params.yaml (`params check`), or print every effective value (`params show`)"),
    "bootstrap_verifier": ("data_prep.bootstrap_verifier", "train the offline demo verifier, or record an external one"),
    "build_corpus": ("data_prep.build_corpus", "regenerate responses with the verifier into the corpus"),
    "extract_features": ("data_prep.extract_features", "the verifier's hidden states per corpus row, for the kinds "
                         "trained offline (`--part i/N`: one of N copies)"),
    "train": ("train.dispatch", f"distill a drafter (`--drafter {'|'.join(DRAFTER_NAMES)}`)"),
    "export": ("export.export", "serving checkpoints, ONNX with parity, TensorRT engines"),
    "evaluate": ("serve_eval.evaluate", "speculative decoding evaluation on the corpus test split"),
    "serve_check": ("serve_eval.serve_check", "run the exported drafters in vLLM (the serve env) against no speculation"),
    "promote": ("pipeline.promote.promote", "register evaluated drafters in MLflow and run the promotion gate"),
    "generate": ("serve_eval.generate", "one speculative generation with accepted tokens highlighted"),
    "registry": ("pipeline.promote.registry_cmd", "inspect the MLflow registry and promote by hand"),
    "timings": ("pipeline.stage_times", "each stage's last wall time under `dvc repro`, and the machine it ran on"),
}


def report_error(error: BaseException) -> int:
    from pipeline.progress import close_progress_bars  # here, not at the top: `draftline --help` stays fast

    code = getattr(error, "exit_code", 1)
    close_progress_bars()  # so that the error stays the last line
    print(f"draftline: error: {error}", file=sys.stderr)
    return code


def _number_arg(text: str, cast: type, valid, requirement: str):
    try:
        value = cast(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not valid(value):
        raise argparse.ArgumentTypeError(f"must be {requirement}, got {text}")
    return value


def temperature_arg(text: str) -> float:
    """argparse type: a sampling temperature (nan/inf/negative are usage errors, not tracebacks)."""
    return _number_arg(text, float, lambda value: math.isfinite(value) and 0.0 <= value <= 5.0, "in [0, 5]")


def positive_int_arg(text: str) -> int:
    return _number_arg(text, int, lambda value: value >= 1, ">= 1")


def stage_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "--params", default=str(DEFAULT_PARAMS_PATH), help="path to params.yaml (default: %(default)s)"
    )
    return parser


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent() -> None:
    """The kernel sends this process SIGTERM when its parent exits, even by SIGKILL (Linux; elsewhere a no-op).
    Also a `preexec_fn`: the child it runs in dies with the process that started it."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _raise_terminated(signum, frame) -> None:
    raise Terminated


@contextlib.contextmanager
def _stage_signals() -> Iterator[None]:
    """SIGTERM unwinds the stage like Ctrl-C (cleanup runs, one line, exit 143); the previous handler is
    restored after (a test calling `main` in-process keeps its own).

    Under `dvc repro` (DVC sets DVC_STAGE) the stage also dies with DVC: a `kill -TERM` of dvc otherwise
    leaves it running with parent 1, later overwriting outputs DVC no longer knows about. PR_SET_PDEATHSIG
    rather than a watchdog polling os.getppid(): the kernel signals at once, even when DVC is SIGKILLed, and
    no thread has to poll in every stage. DVC runs the command through `$SHELL -c`, which execs a single
    command, so the parent is DVC itself. Only under DVC: a stage started by hand (`nohup draftline train &`)
    must outlive the shell that started it."""
    if "DVC_STAGE" in os.environ:
        die_with_parent()
    if threading.current_thread() is not threading.main_thread():  # signals are handled on the main thread only
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _flush_stdout() -> None:
    """Flush stdout now, while a failure (`>/dev/full`, a closed pipe) is still one line: at exit Python would
    print its own 'Exception ignored' report. After a failure stdout points at /dev/null, so that the exit
    flush of what is still buffered succeeds."""
    try:
        sys.stdout.flush()
    except OSError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise


def run_stage(
    parser: argparse.ArgumentParser,
    schema: type[Schema],
    run: Callable[[Schema, argparse.Namespace], object],
    argv: Sequence[str] | None = None,
) -> int:
    """Parse args, load and validate the sections `schema` holds, run; user errors become one line and a non-zero exit.
    A stage `dvc repro` runs records its wall time when it succeeds (pipeline/stage_times.py)."""
    entered = time.time()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = parser.parse_args(argv)
    try:
        with _stage_signals():
            params = load_params(schema, args.params)
            run(params, args)
            if "DVC_STAGE" in os.environ:
                from pipeline.stage_times import process_wall_s, record_stage_time

                record_stage_time(Path(params.project.metrics_dir), os.environ["DVC_STAGE"], process_wall_s(entered))
            _flush_stdout()
    except DraftlineError as error:
        return report_error(error)
    except OSError as error:  # a full disk, a read-only dir, a file where a dir belongs: the OS names it
        with contextlib.suppress(OSError):
            _flush_stdout()
        return report_error(DraftlineError(describe_os_error(error)))
    except KeyboardInterrupt as interrupt:
        from pipeline.progress import close_progress_bars

        close_progress_bars()
        terminated = isinstance(interrupt, Terminated)
        print(f"draftline: {'terminated (SIGTERM)' if terminated else 'interrupted'}", file=sys.stderr)
        return 143 if terminated else 130
    return 0


def run_bench(
    parser: argparse.ArgumentParser,
    schema: type[Schema],
    run: Callable[[Schema, argparse.Namespace], object],
    argv: Sequence[str] | None = None,
) -> int:
    """`run_stage` for a benchmark: its numbers follow a line naming the machine that measured them."""

    def measured(params: Schema, args: argparse.Namespace) -> object:
        from pipeline.machine import print_machine_line  # imports torch: not for `draftline --help`

        print_machine_line()
        return run(params, args)

    return run_stage(parser, schema, measured, argv)


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
