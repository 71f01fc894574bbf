"""Where every stage reads and writes its artifacts (the layout under `project.artifacts_dir`;
what each stage reads and writes: docs/algorithms.md#artifacts)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.config.base import DrafterName
from pipeline.config.stage_params import StageParams
from pipeline.errors import DraftlineError


@dataclass(frozen=True)
class ArtifactPaths:
    root: Path
    metrics: Path
    plots: Path

    @classmethod
    def from_params(cls, params: StageParams, base: Path | str = ".") -> "ArtifactPaths":
        base = Path(base)
        paths = cls(
            root=base / params.project.artifacts_dir,
            metrics=base / params.project.metrics_dir,
            plots=base / params.project.plots_dir,
        )
        for key, path in (("artifacts_dir", paths.root), ("metrics_dir", paths.metrics), ("plots_dir", paths.plots)):
            if path.exists() and not path.is_dir():  # else a stage's first mkdir there is a traceback
                raise DraftlineError(f"project.{key} '{path}' exists and is not a directory; move it away or "
                                     f"point project.{key} elsewhere")
        return paths

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

    @property
    def features(self) -> Path:
        return self.root / "features"

    def drafter(self, kind: DrafterName) -> Path:
        return self.root / "drafters" / kind

    def checkpoints(self, kind: DrafterName) -> Path:
        """Lightning checkpoints of a training run; kept (DVC `persist`) for resume."""
        return self.root / "checkpoints" / kind

    def export(self, kind: DrafterName) -> Path:
        return self.root / "export" / kind
