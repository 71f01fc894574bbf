"""`project`: seed and the output directories every stage writes under."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import StrictBool, model_validator

from pipeline.config.base import Seed
from pipeline.config.section import Section


class ProjectConfig(Section):
    seed: Seed = 0
    artifacts_dir: str = "artifacts"
    metrics_dir: str = "metrics"
    plots_dir: str = "plots"
    # Stages replace their output directories wholesale, so a typo like `/etc` must not be obeyed.
    allow_system_dirs: StrictBool = False
    # A relative dir climbing out of the project (`../../..`) is a typo far more often than a plan.
    allow_outside: StrictBool = False

    @model_validator(mode="after")
    def _not_empty_or_root(self) -> "ProjectConfig":
        """Never allowed: DVC renders `${project.artifacts_dir}/verifier` with an empty dir as `/verifier`."""
        for name, path in self.output_dirs().items():
            if not getattr(self, name).strip():
                raise ValueError(f"{name} is empty; name a directory inside the project")
            if path.is_absolute() and path.resolve() == Path(path.anchor):
                raise ValueError(f"{name} '{path}' is the filesystem root; name a directory inside the project")
        return self

    @model_validator(mode="after")
    def _no_system_dirs(self) -> "ProjectConfig":
        if self.allow_system_dirs:
            return self
        for name, path in self.output_dirs().items():
            if path.is_absolute() and len(path.resolve().parts) <= 2:
                raise ValueError(
                    f"{name} '{path}' is a top-level system directory; use a path inside the project, "
                    "or set project.allow_system_dirs: true if you mean it"
                )
        return self

    @model_validator(mode="after")
    def _relative_dirs_stay_inside(self) -> "ProjectConfig":
        if self.allow_outside:
            return self
        for name, path in self.output_dirs().items():
            if not path.is_absolute() and os.path.normpath(path).split(os.sep)[0] == os.pardir:
                raise ValueError(
                    f"{name} '{path}' leaves the project directory; use a path inside it (or an absolute path), "
                    "or set project.allow_outside: true if you mean it"
                )
        return self

    def output_dirs(self) -> dict[str, Path]:
        return {name: Path(getattr(self, name)) for name in ("artifacts_dir", "metrics_dir", "plots_dir")}

    def dirs_outside(self, project: Path) -> list[str]:
        """Output dirs that resolve outside `project` (allowed, but worth a warning: easy to mistype)."""
        project = project.resolve()
        return [f"{name} {path}" for name, path in self.output_dirs().items()
                if not (project / path).resolve().is_relative_to(project)]
