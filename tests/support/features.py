"""Verifier features for a tiny workspace, made by the extract_features stage itself (engine hf, float32), so
offline training in tests reads exactly what the stage writes."""

from __future__ import annotations

import argparse
from pathlib import Path

from data_prep.extract_features import FeaturesParams, run
from pipeline.features.store import FeatureIndex, read_index

FEATURES_PARAMS = {"dtype": "float32"}  # params.yaml `features` for these features: offline equals online


def write_features(artifacts: Path, train: dict | None = None) -> FeatureIndex:
    """`artifacts/features/` from `artifacts/{verifier,corpus}`, for the layers `train` (params' train section,
    default: every kind's defaults) reads; metrics go beside `artifacts/`."""
    params = FeaturesParams.model_validate({
        "project": {"artifacts_dir": str(artifacts), "metrics_dir": str(artifacts.parent / "metrics"),
                    "plots_dir": str(artifacts.parent / "plots")},
        "features": FEATURES_PARAMS, "train": train or {},
    })
    run(params, argparse.Namespace(part=None))
    return read_index(artifacts / "features")
