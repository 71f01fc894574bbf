"""A vLLM OpenAI server from the serving environment, as a child process that never outlives its stage.

The server runs in its own process group on 127.0.0.1 and a free port. It is stopped (SIGTERM to
the whole group, SIGKILL after a grace period) when the block using it ends: normally, on an error,
on Ctrl-C and on SIGTERM. If the stage itself is SIGKILLed, the kernel sends the server SIGTERM
(PR_SET_PDEATHSIG), so no `vllm` process outlives the stage.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

from pipeline.errors import DraftlineError, Terminated
from pipeline.process_tree import die_with_parent

STOP_GRACE_S = 20.0

# vLLM's CPU runner crashes ("CPU Generator does not use offset") when a seeded request is in a
# chunked (partial) prefill: it rewinds the request's generator the CUDA way. Without chunked
# prefill no prefill is partial, so per-prompt seeds work.
CPU_SEEDED_SAMPLING_ARGS = ["--no-enable-chunked-prefill"]


_handed_out: set[int] = set()
_handing_out = threading.Lock()


def free_port() -> int:
    """A port free now and never handed out before by this process: servers started side by side (serve_check's
    launch commands) each bind theirs only seconds later, and the kernel may offer a port twice meanwhile."""
    with _handing_out:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            if port not in _handed_out:
                _handed_out.add(port)
                return port


def on_cpu() -> bool:
    """No NVIDIA driver tool: the serve env holds vLLM's CPU build (as `make serve-env` decides too)."""
    return shutil.which("nvidia-smi") is None


def log_tail(log_path: Path, lines: int = 1) -> str:
    with contextlib.suppress(OSError):
        tail = [line.strip() for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
        return " | ".join(tail[-lines:])
    return ""


def stop_group(process: subprocess.Popen) -> None:
    """SIGTERM the server's process group, wait, then SIGKILL whatever is left of the group."""
    pgid = process.pid  # start_new_session: the server leads its own group
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    # engine-core workers may outlive the leader for a moment; nothing of the group may remain
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5.0)


class EngineKilled(DraftlineError):
    """An engine ended by a signal (the kernel's OOM killer, an operator's `kill`, a crash): a failure of the
    machine, never a verdict on the model it ran. The stage stops, and its last result stays."""


def check_not_killed(returncode: int | None, what: str, log_path: Path) -> None:
    """Raise `EngineKilled` naming the signal when `returncode` (a Popen's) says one ended the process."""
    if returncode is None or returncode >= 0:
        return
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    cause = " (the kernel's out-of-memory killer sends it: see `dmesg`)" if -returncode == signal.SIGKILL else ""
    raise EngineKilled(f"{what} was killed by {name}{cause}; an engine that died is no evidence about what it ran, "
                       f"so the stage stops and its last result stays; rerun once the cause is gone; log: {log_path}")


def wait_ready(process: subprocess.Popen, port: int, timeout_s: float, log_path: Path, timeout_key: str) -> None:
    """Until GET /health is 200; a server that exits or stays unready raises with its last log line."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            check_not_killed(process.returncode, "vllm serve", log_path)
            raise DraftlineError(
                f"vllm serve exited with code {process.returncode} before it was ready "
                f"({log_tail(log_path) or 'no output'}); full log: {log_path}"
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise DraftlineError(f"vllm serve was not ready after {timeout_s:.0f} s ({timeout_key}); log: {log_path}")


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so the server is stopped on the way out."""
    def interrupt(signum, frame):
        raise Terminated

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: signals cannot be handled here
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


_up: set[subprocess.Popen] = set()  # every server `running_server` holds open now, in any thread
_up_lock = threading.Lock()


@contextlib.contextmanager
def servers_stopped_on_error() -> Iterator[None]:
    """A block that drives servers from other threads (serve_check's launch commands): when it unwinds with an
    exception (Ctrl-C, SIGTERM, a failure) every server still up is stopped at once, so those threads' requests
    fail fast and the threads' pool is not left waiting for servers nobody reads any more."""
    try:
        yield
    except BaseException:
        with _up_lock:
            up = list(_up)
        for process in up:
            stop_group(process)
        raise


@contextlib.contextmanager
def running_server(command: list[str], port: int, log_path: Path, timeout_s: float, timeout_key: str,
                   env: dict[str, str] | None = None, pythonpath: Path | None = None) -> Iterator[subprocess.Popen]:
    """`command` (a server listening on `port`) ready inside the block, its whole process group gone after it.
    `timeout_key` names the setting that bounds the start, for the error. `pythonpath`: a directory of modules
    the server loads by name (a vLLM KV connector), its only PYTHONPATH."""
    # The serve env stands alone: our PYTHONPATH (draftline, its pins) must not leak into it.
    env = {key: value for key, value in (os.environ if env is None else env).items() if key != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with _sigterm_as_interrupt(), open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=env, start_new_session=True, preexec_fn=die_with_parent)
        with _up_lock:
            _up.add(process)
        try:
            wait_ready(process, port, timeout_s, log_path, timeout_key)
            yield process
        finally:
            stop_group(process)
            with _up_lock:
                _up.discard(process)
