"""Engine `vllm`: the stage starts vLLM's OpenAI server on the verifier from the serving environment, then
stops it (`pipeline/server_process.py`: its own process group, 127.0.0.1, a free port, gone with the stage).
build_corpus generates with it; extract_features starts it with extra arguments (its hidden-states extraction).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from pipeline.config.vllm_config import VllmConfig
from pipeline.errors import DraftlineError
from pipeline.server_process import CPU_SEEDED_SAMPLING_ARGS, free_port, on_cpu, running_server
from pipeline.serving_venv import serve_python


@dataclass(frozen=True)
class Server:
    url: str  # OpenAI base URL, http://127.0.0.1:<port>/v1
    pid: int
    dtype: str


def serve_command(python: Path, model: str, config: VllmConfig, *, dtype: str, port: int,
                  cpu: bool = False, trust_remote_code: bool = False, stage_args: Sequence[str] = ()) -> list[str]:
    """`stage_args`: what the stage itself needs of the server, before the user's `extra_args`."""
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
        *stage_args,
        *config.extra_args,
    ]


@contextlib.contextmanager
def vllm_server(model: str, config: VllmConfig, *, dtype: str, log_path: Path, trust_remote_code: bool = False,
                section: str = "corpus", stage_args: Sequence[str] = (), pythonpath: Path | None = None) -> Iterator[Server]:
    """`vllm serve model` on 127.0.0.1, ready (GET /health is 200) inside the block, gone after it.
    `section`: the params section whose `vllm` settings these are (named in errors); `pythonpath`: see
    `running_server`."""
    python = serve_python()
    if python is None:
        raise DraftlineError(
            f"{section}.engine is 'vllm' but the serving environment is missing; run `make serve-env` "
            "(or point DRAFTLINE_SERVE_PYTHON at a python with vllm installed)"
        )
    port = free_port()
    command = serve_command(python, model, config, dtype=dtype, port=port, cpu=on_cpu(),
                            trust_remote_code=trust_remote_code, stage_args=stage_args)
    with running_server(command, port, log_path, config.startup_timeout_s, f"{section}.vllm.startup_timeout_s",
                        pythonpath=pythonpath) as process:
        yield Server(f"http://127.0.0.1:{port}/v1", process.pid, dtype)
