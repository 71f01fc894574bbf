"""MLflow tracking location: params, then $MLFLOW_TRACKING_URI, then the embedded sqlite store."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.config import Params


def tracking_uri(params: Params, base: Path | str = ".") -> str:
    if params.promote.tracking_uri:
        return params.promote.tracking_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{(Path(base) / 'mlflow.db').resolve()}"
