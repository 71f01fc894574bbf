"""How the DSpark drafter trains (stage `train_dspark`): the block family's recipe on `train.dspark`.

The stage writes `artifacts/drafters/dspark/` (the DFlash layout plus `markov_head.*` and, with a confidence
head, `confidence_head.*`), `metrics/train_dspark.json` and `plots/train_dspark_tau.{png,csv}`."""

from __future__ import annotations

from pipeline.drafters.block.training import family_recipe
from pipeline.training.params import TrainParams
from pipeline.training.recipe import DrafterRecipe


def recipe(params: TrainParams, verifier, tokenizer, corpus, features) -> DrafterRecipe:
    return family_recipe(params.train.dspark, params, verifier, tokenizer, corpus, features)
