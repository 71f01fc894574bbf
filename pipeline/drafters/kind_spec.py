"""What is known about a drafter kind before any of its code loads: its name, where its code lives, which
class is its `train.<name>` params section, and what its training stage writes beyond what every kind writes."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from pydantic import BaseModel


@dataclass(frozen=True)
class KindSpec:
    package: str  # pipeline.drafters.<name>: the kind's package, whose modules `module` loads
    config_class: str  # the class in its `config` module that is its `train.<name>` section of params.yaml
    # dvc.yaml plots of stage train_<name> beyond the shared ones: {path under the plots dir: DVC plot options}
    train_plots: tuple[tuple[str, dict], ...] = ()
    # the keys of `train.<name>` its config's `feature_layers` reads: extract_features reruns when they change,
    # not when the kind's other training params do
    feature_params: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The package's name: artifacts/drafters/<name>, stage train_<name>, params train.<name>."""
        return self.package.rpartition(".")[2]

    @property
    def config(self) -> type[BaseModel]:
        """Loaded on use: only the stages that read `train` import the kinds' sections (and rerun on their edits)."""
        return getattr(self.module("config"), self.config_class)

    def module(self, part: str) -> ModuleType:
        """One of the kind's modules (`config`, `kind`, `training`), imported on first use: a stage loads the
        parts it runs, so it depends on those only (pipeline/dvc_pipeline.py: `LOADED_BY_NAME`)."""
        return importlib.import_module(f"{self.package}.{part}")
