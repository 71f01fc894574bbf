"""The one way draftline opens an ONNX model in ONNX Runtime (export parity checks and the ONNX decoding backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import onnxruntime as ort


def ort_session(path: Path, providers: Sequence[str] = ("CPUExecutionProvider",)) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3  # ORT's graph-optimisation warnings are noise for a parity check
    return ort.InferenceSession(str(path), options, providers=list(providers))
