"""Every section of params.yaml: what `draftline params check` validates (stages validate only theirs)."""

from __future__ import annotations

from pathlib import Path

from pipeline.config.base import DEFAULT_PARAMS_PATH
from pipeline.config.corpus_config import CorpusConfig
from pipeline.config.evaluate_config import EvaluateConfig
from pipeline.config.export_config import ExportConfig
from pipeline.config.features_config import FeaturesConfig
from pipeline.config.loader import load_params, parse_params
from pipeline.config.promote_config import PromoteConfig
from pipeline.config.serve_check_config import ServeCheckConfig
from pipeline.config.stage_params import StageParams
from pipeline.config.tracking_config import TrackingConfig
from pipeline.config.train_config import TrainConfig
from pipeline.config.verifier_config import VerifierConfig


class Params(StageParams):
    verifier: VerifierConfig = VerifierConfig()
    corpus: CorpusConfig = CorpusConfig()
    features: FeaturesConfig = FeaturesConfig()
    train: TrainConfig = TrainConfig()
    export: ExportConfig = ExportConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    tracking: TrackingConfig = TrackingConfig()
    serve_check: ServeCheckConfig = ServeCheckConfig()
    promote: PromoteConfig = PromoteConfig()


def load_all(path: str | Path = DEFAULT_PARAMS_PATH) -> Params:
    return load_params(Params, path)


def parse_all(data: object, source: str = "params") -> Params:
    return parse_params(data, Params, source)
