"""Where every stage reads and writes its artifacts (the layout under `project.artifacts_dir`;
what each stage reads and writes: docs/algorithms.md#artifacts)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.config.base import DrafterName
from pipeline.config.stage_params import StageParams


@dataclass(frozen=True)
class ArtifactPaths:
    root: Path
    metrics: Path
    plots: Path

    @classmethod
    def from_params(cls, params: StageParams, base: Path | str = ".") -> "ArtifactPaths":
        base = Path(base)
        return cls(
            root=base / params.project.artifacts_dir,
            metrics=base / params.project.metrics_dir,
            plots=base / params.project.plots_dir,
        )

    @property
    def verifier(self) -> Path:
        return self.root / "verifier"

    @property
    def corpus(self) -> Path:
        return self.root / "corpus"

    @property
    def corpus_shards(self) -> Path:
        """Finished generation shards; kept (DVC `persist`) so a killed build_corpus resumes."""
        return self.root / "corpus_shards"

    def drafter(self, kind: DrafterName) -> Path:
        return self.root / "drafters" / kind

    def checkpoints(self, kind: DrafterName) -> Path:
        """Lightning checkpoints of a training run; kept (DVC `persist`) for resume."""
        return self.root / "checkpoints" / kind

    def export(self, kind: DrafterName) -> Path:
        return self.root / "export" / kind
