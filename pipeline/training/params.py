"""The params every training stage reads (stages `train_<kind>`, `draftline train`, the training benches)
and every kind's recipe receives."""

from __future__ import annotations

from pipeline.config.features_config import FeaturesConfig
from pipeline.config.stage_params import StageParams
from pipeline.config.tracking_config import TrackingConfig
from pipeline.config.train_config import TrainConfig
from pipeline.config.verifier_config import VerifierConfig


class TrainParams(StageParams):
    verifier: VerifierConfig = VerifierConfig()
    features: FeaturesConfig = FeaturesConfig()
    train: TrainConfig = TrainConfig()
    tracking: TrackingConfig = TrackingConfig()
