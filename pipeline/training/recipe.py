"""What a kind hands the training stage: its drafter, data, Lightning module and agreement evaluation.

Each kind's `pipeline/drafters/<kind>/training.py` defines `recipe` (a `RecipeFactory`); the stage
(`train/distill.py`) loads the verifier (or, offline, its head and features) and corpus, calls it, and owns
everything else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import lightning as L
from datasets import DatasetDict
from pydantic import BaseModel
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pipeline.config.trainer_config import TrainerConfig
from pipeline.paths import ArtifactPaths
from pipeline.training.feature_batches import TrainingFeatures
from pipeline.training.frozen import VerifierSource
from pipeline.training.params import TrainParams


@dataclass
class DrafterRecipe:
    kind: str
    config: BaseModel  # params.train.<kind>
    trainer_config: TrainerConfig
    drafter: PreTrainedModel
    data: L.LightningDataModule  # exposes `val_set` (held-out rows)
    make_module: Callable[[], L.LightningModule]
    # agreement with the verifier on held-out rows: {"loss", <agreement_keys>...}
    evaluate: Callable[[PreTrainedModel, VerifierSource], dict]
    agreement_keys: tuple[str, ...]  # recorded trained and untrained in training.json
    per_position_key: str  # the per-position list shown in the summary
    extra_info: dict = field(default_factory=dict)
    # the kind's own outputs beyond the shared ones, written on rank 0 after the drafter is saved
    after_save: Callable[[ArtifactPaths], None] | None = None


# (params, verifier, tokenizer, corpus, features): `features` is the checked feature set when the kind trains
# offline (then `verifier` holds only the head), None online
RecipeFactory = Callable[[TrainParams, VerifierSource, PreTrainedTokenizerBase, DatasetDict, TrainingFeatures | None],
                         DrafterRecipe]
