"""launch.md's `llama-server` command for a drafter, from one argument list.

llama.cpp's server flags (build 11434's `common/arg.cpp`, the tree the converter comes from): `-m` the
verifier, `-md` the drafter, `--spec-type` how the drafter drafts, `--spec-draft-n-max` the draft length,
`--spec-draft-sampling probabilistic` to sample drafts and verify them by rejection at T > 0 (the
default, greedy, drafts argmax there; draftline measures τ with sampled drafts, as vLLM's
`draft_sample_method: probabilistic`).
"""

from __future__ import annotations

import shlex

SERVER = "llama-server"
HOST = "127.0.0.1"
PORT = 8080  # launch.md's; serve_check puts a free port in its place


def server_arguments(verifier_gguf: str, draft_gguf: str, spec_type: str, draft_max: int, port: int = PORT) -> list[str]:
    return ["-m", verifier_gguf, "-md", draft_gguf, "--spec-type", spec_type, "--spec-draft-n-max", str(draft_max),
            "--spec-draft-sampling", "probabilistic", "--host", HOST, "--port", str(port)]


def command_line(arguments: list[str]) -> str:
    """One shell line: what launch.md shows and what a user pastes."""
    return shlex.join([SERVER, *arguments])
