"""Feature engines for `extract_features`: each runs the verifier over token rows and returns its hidden
states at the requested layers (`hf`: the verifier in this process; `vllm`: vLLM's `extract_hidden_states`
from the serving environment).

Layers are HF `output_hidden_states` indices, except the last layer N, which an engine returns *before*
the verifier's final norm (the layout pipeline/features/store.py stores).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from torch import Tensor

from pipeline.config.features_config import FeaturesConfig
from pipeline.config.verifier_config import VerifierConfig


class FeatureEngine(Protocol):
    def extract(self, rows: list[list[int]], layers: list[int]) -> list[dict[int, Tensor]]:
        """Per row, {layer: (tokens, hidden) float32 on the CPU}; the same rows give the same bytes."""

    def describe(self) -> dict:
        """Name, version and settings, recorded in the feature index."""

    def close(self) -> None:
        """Release the model (or stop the server the engine started)."""


def start_engine(config: FeaturesConfig, *, location: str, verifier: VerifierConfig, log_dir: Path) -> FeatureEngine:
    """The engine `features.engine` names; `log_dir` takes a server's log and the files it passes states through
    (vLLM starts its server on the first `extract`, for the layers asked)."""
    if config.engine == "hf":
        from data_prep.feature_engines.hf_engine import HFFeatureEngine

        return HFFeatureEngine.load(location, config, verifier)
    from data_prep.feature_engines.vllm_engine import VllmFeatureEngine

    return VllmFeatureEngine(location, config.vllm, dtype=verifier.dtype, work_dir=log_dir,
                             trust_remote_code=verifier.trust_remote_code)
