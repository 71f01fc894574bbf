"""`train`: one subsection per drafter kind, each defined in its kind's package (pipeline/drafters/registry.py)."""

from __future__ import annotations

from pydantic import create_model

from pipeline.config.section import Section
from pipeline.drafters.registry import KIND_SPECS

# Built from the registry, so a new kind's `train.<kind>` section needs no edit here.
TrainConfig = create_model(
    "TrainConfig", __base__=Section, **{name: (spec.config, spec.config()) for name, spec in KIND_SPECS.items()}
)
