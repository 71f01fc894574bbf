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
from pipeline.errors import DraftlineError

VLLM_ENGINE = "data_prep.feature_engines.vllm_engine"


class FeatureEngine(Protocol):
    def extract(self, rows: list[list[int]], layers: list[int]) -> list[dict[int, Tensor]]:
        """Per row, {layer: (tokens, hidden) float32 on the CPU}; the same rows give the same bytes."""

    def describe(self) -> dict:
        """Name, version and settings, recorded in the feature index."""

    def close(self) -> None:
        """Release the model (or stop the server the engine started)."""


def start_engine(config: FeaturesConfig, *, location: str, verifier: VerifierConfig, layers: list[int],
                 log_dir: Path) -> FeatureEngine:
    """The engine `features.engine` names, ready to extract `layers` (vLLM fixes them when it starts);
    `log_dir` takes a server's log."""
    if config.engine == "hf":
        from data_prep.feature_engines.hf_engine import HFFeatureEngine

        return HFFeatureEngine.load(location, config, verifier)
    try:
        from data_prep.feature_engines.vllm_engine import VllmFeatureEngine
    except ModuleNotFoundError as error:
        if error.name != VLLM_ENGINE:
            raise
        raise DraftlineError("features.engine vllm is not part of this draftline build; set features.engine: hf") from None
    return VllmFeatureEngine.start(location, config, verifier, layers, log_dir)
