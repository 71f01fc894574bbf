"""Verifier features for a tiny workspace, made by the extract_features stage itself (engine hf, float32), so
offline training in tests reads exactly what the stage writes."""

from __future__ import annotations

import argparse
from pathlib import Path

from data_prep.extract_features import FeaturesParams, run
from pipeline.features.store import FeatureIndex, read_index

FEATURES_PARAMS = {"dtype": "float32"}  # params.yaml `features` for these features: offline equals online


def write_features(artifacts: Path, train: dict | None = None, **features) -> FeatureIndex:
    """`artifacts/features/` from `artifacts/{verifier,corpus}`, for the layers `train` (params' train section,
    default: every kind's defaults) reads, with `features` settings over FEATURES_PARAMS; metrics go beside
    `artifacts/`."""
    params = FeaturesParams.model_validate({
        "project": {"artifacts_dir": str(artifacts), "metrics_dir": str(artifacts.parent / "metrics"),
                    "plots_dir": str(artifacts.parent / "plots")},
        "features": {**FEATURES_PARAMS, **features}, "train": train or {},
    })
    run(params, argparse.Namespace(part=None))
    return read_index(artifacts / "features")


def overwrite_tail(path: Path, count: int = 64) -> None:
    """Change a shard after extraction: bytes inside its last tensor's data, so that the file still parses and only
    values change (0xFF bytes: NaN in every float format)."""
    data = bytearray(path.read_bytes())
    data[-count:] = b"\xff" * count
    path.write_bytes(bytes(data))
