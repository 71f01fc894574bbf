"""The base of every stage's params: the sections it reads, the checks spanning them, a lineage hash."""

from __future__ import annotations

import hashlib
import json

from pydantic import model_validator

from pipeline.config.project_config import ProjectConfig
from pipeline.config.section import CROSS_CHECKS, Section


class StageParams(Section):
    """Subclass with the sections a stage reads (every stage reads `project`: paths and seed)."""

    project: ProjectConfig = ProjectConfig()

    @model_validator(mode="after")
    def _cross_checks(self) -> "StageParams":
        for sections, check in CROSS_CHECKS:
            if all(name in type(self).model_fields for name in sections):
                check(self)
        return self

    def section_hash(self, *names: str) -> str:
        """Stable hash of the named sections (all this stage holds when none), recorded as lineage."""
        dumped = self.model_dump(mode="json")
        chosen = {name: dumped[name] for name in (names or dumped.keys())}
        return hashlib.sha256(json.dumps(chosen, sort_keys=True).encode()).hexdigest()[:16]
