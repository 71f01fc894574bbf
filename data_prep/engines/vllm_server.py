"""Engine `vllm`: the stage starts `vllm serve <verifier>` from the serving environment, then stops it.

The server runs in its own process group on 127.0.0.1 and a free port. It is stopped (SIGTERM to
the whole group, SIGKILL after a grace period) when the stage ends: normally, on an error, on Ctrl-C
and on SIGTERM. If the stage itself is SIGKILLed, the kernel sends the server SIGTERM
(PR_SET_PDEATHSIG), so no `vllm` process outlives the stage.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from pipeline.cli import die_with_parent
from pipeline.config.corpus_config import VllmConfig
from pipeline.errors import DraftlineError, Terminated
from pipeline.serving_venv import serve_python

STOP_GRACE_S = 20.0


@dataclass(frozen=True)
class Server:
    url: str  # OpenAI base URL, http://127.0.0.1:<port>/v1
    pid: int
    dtype: str


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def on_cpu() -> bool:
    """No NVIDIA driver tool: the serve env holds vLLM's CPU build (as `make serve-env` decides too)."""
    return shutil.which("nvidia-smi") is None


# vLLM's CPU runner crashes ("CPU Generator does not use offset") when a seeded request is in a
# chunked (partial) prefill: it rewinds the request's generator the CUDA way. Without chunked
# prefill no prefill is partial, so per-prompt seeds work.
CPU_SEEDED_SAMPLING_ARGS = ["--no-enable-chunked-prefill"]


def serve_command(python: Path, model: str, config: VllmConfig, *, dtype: str, port: int,
                  cpu: bool = False, trust_remote_code: bool = False) -> list[str]:
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", model,
        "--served-model-name", "verifier", "--host", "127.0.0.1", "--port", str(port),
        "--dtype", dtype,
        "--tensor-parallel-size", str(config.tensor_parallel_size),
        "--data-parallel-size", str(config.data_parallel_size),
        "--gpu-memory-utilization", str(config.gpu_memory_utilization),
        # sampling exactly as each request says, not the model's generation_config.json defaults
        "--generation-config", "vllm",
        *(["--max-model-len", str(config.max_model_len)] if config.max_model_len else []),
        *(CPU_SEEDED_SAMPLING_ARGS if cpu else []),
        *(["--trust-remote-code"] if trust_remote_code else []),
        *config.extra_args,
    ]


def _log_tail(log_path: Path, lines: int = 1) -> str:
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


def wait_ready(process: subprocess.Popen, port: int, timeout_s: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise DraftlineError(
                f"vllm serve exited with code {process.returncode} before it was ready "
                f"({_log_tail(log_path) or 'no output'}); full log: {log_path}"
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise DraftlineError(
        f"vllm serve was not ready after {timeout_s:.0f} s (corpus.vllm.startup_timeout_s); log: {log_path}"
    )


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


@contextlib.contextmanager
def vllm_server(model: str, config: VllmConfig, *, dtype: str, log_path: Path,
                trust_remote_code: bool = False) -> Iterator[Server]:
    """`vllm serve model` on 127.0.0.1, ready (GET /health is 200) inside the block, gone after it."""
    python = serve_python()
    if python is None:
        raise DraftlineError(
            "corpus.engine is 'vllm' but the serving environment is missing; run `make serve-env` "
            "(or point DRAFTLINE_SERVE_PYTHON at a python with vllm installed)"
        )
    port = free_port()
    command = serve_command(python, model, config, dtype=dtype, port=port, cpu=on_cpu(),
                            trust_remote_code=trust_remote_code)
    # The serve env stands alone: our PYTHONPATH (draftline, its pins) must not leak into it.
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with _sigterm_as_interrupt(), open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=env, start_new_session=True, preexec_fn=die_with_parent)
        try:
            wait_ready(process, port, config.startup_timeout_s, log_path)
            yield Server(f"http://127.0.0.1:{port}/v1", process.pid, dtype)
        finally:
            stop_group(process)
