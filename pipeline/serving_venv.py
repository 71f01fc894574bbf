"""Where the serving environments (`make serve-env`: vLLM without draftline, and llama.cpp) live."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def serve_python() -> Path | None:
    """The serve env's interpreter: `$DRAFTLINE_SERVE_PYTHON`, else `<repo>/.venv-serve`; None if absent."""
    override = os.environ.get("DRAFTLINE_SERVE_PYTHON")
    candidate = Path(override) if override else REPO_ROOT / ".venv-serve" / "bin" / "python"
    return candidate if candidate.exists() else None


LLAMACPP_VENV = REPO_ROOT / ".venv-llamacpp"
LLAMACPP_TREE = LLAMACPP_VENV / "llama.cpp"  # the converter's llama.cpp tree, extracted by `make serve-env`


def llamacpp_python() -> Path | None:
    """`make serve-env`'s llama.cpp env interpreter (xllamacpp + the converter's imports); None until it is built."""
    candidate = LLAMACPP_VENV / "bin" / "python"
    return candidate if candidate.exists() and (LLAMACPP_TREE / "convert_hf_to_gguf.py").is_file() else None
