"""Every drafter kind's behaviour by name (`pipeline.drafters.interface.DrafterKind`), for the stages that
export, load and serve drafters. Built from the registry's list (pipeline/drafters/registry.py): importing
this loads every kind's `kind` module (dvc.yaml's generator counts them in such a stage's code)."""

from __future__ import annotations

from pipeline.drafters.interface import DrafterKind
from pipeline.drafters.registry import KIND_SPECS

KINDS: dict[str, DrafterKind] = {name: spec.module("kind").KIND for name, spec in KIND_SPECS.items()}
