"""`tracking`: where MLflow runs and the model registry live."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from pipeline.config.section import Section


class TrackingConfig(Section):
    """Where MLflow runs (training, promotion) and the model registry live; read by every stage that logs."""

    uri: Optional[str] = Field(None, description="None: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db")
    experiment: str = "draftline"
