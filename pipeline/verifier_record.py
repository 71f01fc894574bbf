"""The verifier's record, `artifacts/verifier/verifier.json`: where the model is and which weights it is.

`bootstrap_verifier` writes it; every stage that binds to the verifier (corpus, training, export,
evaluation, serve_check, promote) reads it and checks the identity here, without loading the model.
It says where the model is: the directory itself (bootstrap) or an external local path / cached HF
name (source `hf`). A stage reads it only when it records the verifier params.yaml configures: after
`verifier` changes and bootstrap_verifier fails (or has not run), the record still names the old model,
and a stage reading it would silently build on that one.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.atomic import write_json_atomic
from pipeline.config.verifier_config import VerifierConfig
from pipeline.errors import DraftlineError
from pipeline.lineage import library_versions, model_identity
from pipeline.paths import ArtifactPaths

RECORD_NAME = "verifier.json"
BOOTSTRAP_NAME = "bootstrap.json"  # the demo verifier's training report, with the `verifier.bootstrap` it used
MISSING_HINT = "run `dvc repro bootstrap_verifier` (or `draftline bootstrap_verifier`)"


def read_record(paths: ArtifactPaths) -> dict:
    record_path = paths.verifier / RECORD_NAME
    if not record_path.is_file():
        raise DraftlineError(f"no verifier at {paths.verifier} ({RECORD_NAME} missing); {MISSING_HINT}")
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise DraftlineError(f"{record_path} is not valid JSON ({error}); {MISSING_HINT}") from None
    if not isinstance(record, dict) or not {"source", "name_or_path", "hash", "id"} <= record.keys():
        raise DraftlineError(f"{record_path} lacks source/name_or_path/hash/id; {MISSING_HINT}")
    if paths.verifier_config is not None:
        check_configured(paths, record, paths.verifier_config)
    return record


def configured_location(config: VerifierConfig) -> str | None:
    """What params.yaml names as an external verifier, as its record keeps it: a local dir resolved (`./m` and
    `m` are one model), a cached HF name as written; None for the bootstrapped demo verifier."""
    if config.source != "hf":
        return None
    path = Path(config.name_or_path).expanduser()
    return str(path.resolve()) if path.is_dir() else config.name_or_path


def check_configured(paths: ArtifactPaths, record: dict, config: VerifierConfig) -> None:
    """The record names the verifier params.yaml configures (source and location; for the demo verifier the
    `verifier.bootstrap` settings it was trained with), else one line saying how to record that one."""
    record_path = paths.verifier / RECORD_NAME
    recorded = ("the bootstrapped demo verifier" if record["source"] == "bootstrap"
                else f"the external verifier {record.get('configured', record['name_or_path'])}")
    configured = ("the bootstrapped demo verifier" if config.source == "bootstrap"
                  else f"the external verifier {config.name_or_path}")
    differs = record["source"] != config.source or record.get("configured") != configured_location(config)
    bootstrap_report = paths.verifier / BOOTSTRAP_NAME
    if not differs and config.source == "bootstrap" and bootstrap_report.is_file():
        try:
            trained_with = json.loads(bootstrap_report.read_text(encoding="utf-8")).get("params")
        except (OSError, ValueError, AttributeError):
            trained_with = None
        if trained_with != config.bootstrap.model_dump(mode="json"):
            differs, configured = True, f"{configured} with other verifier.bootstrap settings"
    if differs:
        raise DraftlineError(f"{record_path} records {recorded}, but params.yaml configures {configured}; record the "
                             f"configured one first: {MISSING_HINT}")


def write_record(directory: Path, *, source: str, name_or_path: str, id_prefix: str,
                 trust_remote_code: bool = False, model_dir: Path | None = None, configured: str | None = None) -> dict:
    """Write `verifier.json` into `directory`; the hash is the model identity of `model_dir` (default:
    `directory` itself), so the id, and the registered model names built from it, survive a library
    upgrade that only re-stamps the checkpoint's files. `configured`: an external verifier as params.yaml
    names it (`configured_location`), which every reader compares with its own params.

    Tests use it too: a checkpoint saved into `artifacts/verifier/` plus this record is a verifier.
    """
    content_hash = model_identity(model_dir or directory)
    record = {"source": source, "name_or_path": name_or_path, "hash": content_hash,
              "id": f"{id_prefix}-{content_hash[:12]}", "trust_remote_code": trust_remote_code,
              "library_versions": library_versions()}
    if configured is not None:
        record["configured"] = configured
    write_json_atomic(Path(directory) / RECORD_NAME, record)
    return record


def verifier_identity(paths: ArtifactPaths) -> dict:
    """The verifier's id and hash, the hash recomputed from its files now. `verifier.json` is a file anyone
    can edit and, for an external verifier, the model lives outside what DVC tracks: training fingerprints,
    corpus shards, exports, metrics and registered model names all bind to this identity, so it must be
    the identity of the weights that are actually there."""
    record = read_record(paths)
    record_path = paths.verifier / RECORD_NAME
    location = Path(model_location(paths, record))
    if record["source"] == "bootstrap":
        fix = "restore it (`dvc checkout bootstrap_verifier`) or rebuild it (`dvc repro bootstrap_verifier`)"
    else:  # DVC does not track the external model's files, so only a forced run re-records it
        fix = "re-record it with `dvc repro -f bootstrap_verifier` (or `draftline bootstrap_verifier`)"
    if not (location / "config.json").is_file():  # never hash whatever tree the record points at ("/")
        raise DraftlineError(f"the verifier recorded in {record_path} is not at {location} (no config.json); {fix}")
    try:
        now = model_identity(location)
    except OSError as error:
        raise DraftlineError(f"cannot read the verifier at {location} ({error}); {fix}") from None
    if now != record["hash"]:
        raise DraftlineError(f"the verifier at {location} is not the one {record_path} recorded (its files hash to "
                             f"{now[:12]}, recorded {str(record['hash'])[:12]}); {fix}")
    if not str(record["id"]).endswith(f"-{now[:12]}"):  # registered model names are built from the id
        raise DraftlineError(f"{record_path}: id '{record['id']}' is not one bootstrap_verifier gives the verifier "
                             f"with hash {now[:12]}; {fix}")
    return {"id": record["id"], "hash": now, "source": record["source"]}


def model_location(paths: ArtifactPaths, record: dict) -> str:
    """The directory (or cached HF name) to load: the verifier dir itself for a bootstrapped model."""
    return str(paths.verifier) if record["source"] == "bootstrap" else record["name_or_path"]
