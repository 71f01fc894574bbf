"""MLflow tracking location: `tracking.uri` in params, then $MLFLOW_TRACKING_URI, then the embedded sqlite store."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.config import Params


def tracking_uri(params: Params, base: Path | str = ".") -> str:
    if params.tracking.uri:
        return params.tracking.uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{(Path(base) / 'mlflow.db').resolve()}"


def sqlite_path(uri: str) -> Path | None:
    return Path(uri.removeprefix("sqlite:///")).resolve() if uri.startswith("sqlite:///") else None


def sqlite_artifact_root(uri: str) -> str | None:
    """Artifacts of an embedded sqlite store live next to the database file, not in the cwd."""
    database = sqlite_path(uri)
    return str(database.parent / "mlruns") if database else None
