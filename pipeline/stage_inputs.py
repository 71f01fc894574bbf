"""Files a stage reads that params.yaml names, outside the code: they are DVC deps of that stage.

`corpus.sources` of kind `file` are read by `build_corpus`; a local external verifier directory
(`verifier.source: hf` with `name_or_path` a directory) is read by `bootstrap_verifier`. DVC needs deps
written in dvc.yaml before it runs anything, and its templating cannot turn a list in params.yaml into
deps, so `python -m pipeline.dvc_pipeline` reads params.yaml and lists them (docs/reliability.md#inputs).
A stage run by DVC checks that dvc.yaml is what the generator makes (`dvc_pipeline.check_generated`), so a
params edit without regenerating fails instead of leaving the file untracked.

Not listed: an `hf` dataset or a verifier named by hub id (their cached snapshots are immutable per
revision and their paths are machine-specific); the verifier's content hash check covers the latter.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.config.corpus_config import CorpusConfig
from pipeline.config.stage_params import StageParams
from pipeline.config.verifier_config import VerifierConfig


class InputParams(StageParams):
    verifier: VerifierConfig = VerifierConfig()
    corpus: CorpusConfig = CorpusConfig()


def dep_path(path: str, root: Path) -> str:
    """`path` as dvc.yaml names it: relative to the project root when inside it, else absolute.
    Stages resolve a relative path against their working directory, which DVC sets to the root."""
    location = Path(os.path.normpath(root / Path(path).expanduser()))
    return location.relative_to(root).as_posix() if location.is_relative_to(root) else location.as_posix()


def corpus_inputs(params: InputParams, root: Path) -> list[str]:
    return sorted({dep_path(source.path, root) for source in params.corpus.sources if source.kind == "file"})


def verifier_inputs(params: InputParams, root: Path) -> list[str]:
    config = params.verifier
    if config.source != "hf" or not (root / Path(config.name_or_path).expanduser()).is_dir():
        return []  # the demo verifier is built by the stage; a hub id is not a path
    return [dep_path(config.name_or_path, root)]


STAGE_INPUTS = {"bootstrap_verifier": verifier_inputs, "build_corpus": corpus_inputs}
