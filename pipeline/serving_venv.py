"""Where the serving environment (`make serve-env`: vLLM without draftline) lives."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def serve_python() -> Path | None:
    """The serve env's interpreter: `$DRAFTLINE_SERVE_PYTHON`, else `<repo>/.venv-serve`; None if absent."""
    override = os.environ.get("DRAFTLINE_SERVE_PYTHON")
    candidate = Path(override) if override else REPO_ROOT / ".venv-serve" / "bin" / "python"
    return candidate if candidate.exists() else None
