"""Where every stage reads and writes its artifacts (the layout under `project.artifacts_dir`;
what each stage reads and writes: docs/algorithms.md#artifacts).

A project is self-contained: every artifact dir resolves, through symlinks, inside the project it runs in
(or inside the output dir that params.yaml puts elsewhere on purpose). A dir moved out and symlinked back,
or a project copied with its symlinks, would otherwise read and overwrite another project's files while
recording this project's hashes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pipeline.config.base import DrafterName
from pipeline.config.stage_params import StageParams
from pipeline.config.verifier_config import VerifierConfig
from pipeline.errors import DraftlineError


def home_of(base: Path, configured: Path) -> Path:
    """Where an output dir must resolve: the project (`base`) when params name a dir inside it, else the
    configured dir itself (put outside on purpose: an absolute path, or `project.allow_outside`)."""
    inside = Path(os.path.abspath(base / configured)).is_relative_to(os.path.abspath(base))
    return base.resolve() if inside else (base / configured).resolve()


def check_inside(path: Path, home: Path, fix: str) -> Path:
    """`path`, refused with one line when it resolves (through symlinks) outside `home`."""
    resolved = path.resolve()
    if not resolved.is_relative_to(home):
        raise DraftlineError(f"{path} resolves to {resolved}, outside {home} (a symlink, or a dir moved out of the "
                             f"project): a project reads and writes only its own files; {fix}")
    return path


@dataclass(frozen=True)
class ArtifactPaths:
    root: Path
    metrics: Path
    plots: Path
    # Where the artifact dirs must resolve (`home_of`); None (paths built by hand) checks nothing.
    home: Path | None = None
    # What params.yaml configures as the verifier, when the stage reads that section:
    # `verifier_record.read_record` refuses a record of another verifier.
    verifier_config: VerifierConfig | None = None

    @classmethod
    def from_params(cls, params: StageParams, base: Path | str = ".") -> "ArtifactPaths":
        base = Path(base)
        dirs = params.project.output_dirs()
        for key, configured in dirs.items():
            path = base / configured
            if path.exists() and not path.is_dir():  # else a stage's first mkdir there is a traceback
                raise DraftlineError(f"project.{key} '{path}' exists and is not a directory; move it away or "
                                     f"point project.{key} elsewhere")
            check_inside(path, home_of(base, configured), f"move it back, or set project.{key} to where it is if "
                                                          "you mean it")
        return cls(root=base / dirs["artifacts_dir"], metrics=base / dirs["metrics_dir"], plots=base / dirs["plots_dir"],
                   home=home_of(base, dirs["artifacts_dir"]), verifier_config=getattr(params, "verifier", None))

    def _inside(self, path: Path) -> Path:
        if self.home is None:
            return path
        return check_inside(path, self.home, "move it back into the project (or re-run the stage that writes it), "
                                             "or set project.artifacts_dir to where it is if you mean it")

    @property
    def verifier(self) -> Path:
        return self._inside(self.root / "verifier")

    @property
    def corpus(self) -> Path:
        return self._inside(self.root / "corpus")

    @property
    def corpus_shards(self) -> Path:
        """Finished generation shards; kept (DVC `persist`) so a killed build_corpus resumes."""
        return self._inside(self.root / "corpus_shards")

    @property
    def features(self) -> Path:
        """The verifier's hidden states per corpus row (pipeline/features/store.py); shards kept (DVC `persist`)
        so a killed extract_features resumes."""
        return self._inside(self.root / "features")

    def drafter(self, kind: DrafterName) -> Path:
        return self._inside(self.root / "drafters" / kind)

    def checkpoints(self, kind: DrafterName) -> Path:
        """Lightning checkpoints of a training run; kept (DVC `persist`) for resume."""
        return self._inside(self.root / "checkpoints" / kind)

    def export(self, kind: DrafterName) -> Path:
        return self._inside(self.root / "export" / kind)
