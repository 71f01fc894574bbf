"""The `draftline` command: one subcommand per stage, plus `params check`, `features estimate`, `generate`,
`registry` and `timings`.

Each stage module owns its argument parser and exposes `main(argv)`; this file only dispatches, so
`draftline --help` stays fast and every stage also runs as `python -m <package>.<stage>`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import math
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

from pipeline.config.base import DEFAULT_PARAMS_PATH, DRAFTER_NAMES
from pipeline.config.loader import Schema, load_params
from pipeline.errors import DraftlineError, Terminated, describe_os_error, os_error_behind
from pipeline.process_tree import descendants, die_with_parent, end_started, set_subreaper

# subcommand -> (module with main(argv), one-line description)
COMMANDS: dict[str, tuple[str, str]] = {
    "params": ("pipeline.params_cmd", "validate params.yaml (`params check`), or print every effective value (`params show`)"),
    "bootstrap_verifier": ("data_prep.bootstrap_verifier", "train the offline demo verifier, or record an external one"),
    "build_corpus": ("data_prep.build_corpus", "regenerate responses with the verifier into the corpus"),
    "extract_features": ("data_prep.extract_features", "the verifier's hidden states per corpus row, for the kinds "
                         "trained offline (`--part i/N`: one of N copies)"),
    "features": ("pipeline.features.estimate", "`features estimate VERIFIER --tokens N`: the disk its features need "
                 "per features.dtype, from its config.json"),
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


# Signals that end a stage like Ctrl-C: `kill`, dvc's own SIGTERM, a closed terminal or ssh session.
TERMINATING = (signal.SIGTERM, signal.SIGHUP)
# After a terminating signal the stage has this long to unwind (stopping a vLLM server takes up to ~30 s);
# then it ends what it started and exits, even if a library swallowed the interrupt or a thread blocks exit.
EXIT_GRACE_S = 60.0


def _force_exit(signum: int, before: set[int]) -> None:
    print(f"draftline: the stage did not stop within {EXIT_GRACE_S:.0f} s of {signal.Signals(signum).name}; "
          "ending it and the processes it started", file=sys.stderr, flush=True)
    end_started(before)
    os._exit(128 + signum)


SIGTERM_GRACE_S = 10.0


def _end_if_stuck(wakeups: socket.socket, received: list[int], before: set[int]) -> None:
    """Python runs a signal's handler only between bytecodes of the main thread, so a stage blocked in C++ (a
    torch.distributed rendezvous or collective waiting for a peer that never comes) never sees the signal, and
    `timeout`/`kill` could not end it. The C-level handler also writes the signal's number to the wakeup socket:
    this thread reads it, and when the Python handler has still not run SIGTERM_GRACE_S later (nothing in
    `received`), ends the stage with the line and exit code an unwound one gives. A stage that did see the signal
    is unwinding: `_force_exit`'s longer timer covers it."""
    while True:
        try:
            data = wakeups.recv(64)
        except OSError:
            return
        if not data:  # the stage ended: its end of the pair was closed
            return
        for signum in data:
            if signum in TERMINATING:
                time.sleep(SIGTERM_GRACE_S)
                if not received:
                    with contextlib.suppress(OSError):
                        print(f"draftline: terminated ({signal.Signals(signum).name})", file=sys.stderr, flush=True)
                    end_started(before)
                    os._exit(128 + signum)
                return


@contextlib.contextmanager
def _stage_process(received: list[int]) -> Iterator[None]:
    """The stage and what it starts end together (pipeline/process_tree.py). `received` collects the
    terminating signals that arrived: a library may turn the interrupt into its own (Lightning into exit(1),
    which training turns into a plain KeyboardInterrupt), and the stage's last line still names the signal.

    SIGTERM and SIGHUP unwind the stage like Ctrl-C (cleanup runs, one line naming the signal, exit 128 +
    signal); a SIGHUP that is ignored (`nohup`) stays ignored. The first one also arms a timer: a stage still
    alive `EXIT_GRACE_S` later is ended. On the way out, whatever way, every process the stage started (and
    theirs: the stage is their subreaper) is ended. The previous handlers are restored after (a test calling
    `main` in-process keeps its own).

    Under `dvc repro` (DVC sets DVC_STAGE) the stage also dies with DVC: a `kill -TERM` of dvc otherwise
    leaves it running with parent 1, later overwriting outputs DVC no longer knows about. PR_SET_PDEATHSIG
    rather than a watchdog polling os.getppid(): the kernel signals at once, even when DVC is SIGKILLed, and
    no thread has to poll in every stage. DVC runs the command through `$SHELL -c`, which execs a single
    command, so the parent is DVC itself. Only under DVC: a stage started by hand (`nohup draftline train &`)
    must outlive the shell that started it. A stage blocked in C++, where no Python handler runs, still ends
    SIGTERM_GRACE_S after a SIGTERM (`_end_if_stuck`)."""
    if "DVC_STAGE" in os.environ:
        die_with_parent()
    before = descendants()
    was_subreaper = set_subreaper(True)
    previous: dict[int, object] = {}
    armed: list[threading.Timer] = []

    def terminate(signum, frame) -> None:
        received.append(signum)
        if not armed:
            armed.append(threading.Timer(EXIT_GRACE_S, _force_exit, (signum, before)))
            armed[0].daemon = True
            armed[0].start()
        raise Terminated(signum)

    on_main = threading.current_thread() is threading.main_thread()  # signals are handled on the main thread only
    if on_main:
        for signum in TERMINATING:
            if signal.getsignal(signum) is not signal.SIG_IGN:
                previous[signum] = signal.signal(signum, terminate)
        reader, writer = socket.socketpair()
        writer.setblocking(False)  # set_wakeup_fd needs it: the C handler must never block
        previous_wakeup = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        watchdog = threading.Thread(target=_end_if_stuck, args=(reader, received, before), name="signal-watchdog",
                                    daemon=True)
        watchdog.start()
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if on_main:
            signal.set_wakeup_fd(previous_wakeup)
            writer.close()  # the watchdog reads end-of-file and returns
            reader.close()
        end_started(before)
        set_subreaper(was_subreaper)
        # an armed timer stays armed: after a signal the process is on its way out, and exit itself can hang
        # (a non-daemon thread that never ends)


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
    received: list[int] = []
    try:
        with _stage_process(received):
            params = load_params(schema, args.params)
            from pipeline.dvc_pipeline import check_generated  # here: `draftline --help` stays fast

            check_generated()
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
    except Exception as error:
        # a library that wraps the OS's error in its own type (safetensors, torch's C++ writers): the same one line
        behind = os_error_behind(error)
        if behind is None:
            raise
        return report_error(DraftlineError(describe_os_error(behind, unnamed="an output of this stage")))
    except KeyboardInterrupt as interrupt:
        from pipeline.progress import close_progress_bars

        close_progress_bars()
        signum = interrupt.signum if isinstance(interrupt, Terminated) else (received or [None])[0]
        if signum is not None:
            print(f"draftline: terminated ({signal.Signals(signum).name})", file=sys.stderr)
            return 128 + signum
        print("draftline: interrupted", file=sys.stderr)
        return 130
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
