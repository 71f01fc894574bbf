"""The MLflow side of promotion: tracking runs, logged drafter models, registered versions, aliases.

One registered model per verifier x drafter kind (`<prefix>-<verifier id>-<kind>`). Each evaluated
drafter is an MLflow 3 logged model (its artifacts are the serving checkpoint, so
`models:/<name>@champion` downloads a directory `from_pretrained` loads) registered as a new version.
Gate metrics and lineage are version tags, which is also how the gate reads the champion back.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
import time
from pathlib import Path
from typing import Iterator, Mapping

from filelock import FileLock, Timeout
from sqlalchemy.exc import SQLAlchemyError

# Before mlflow is imported: no telemetry, no background logging threads, no artifact progress bars.
os.environ.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
# MLflow retries a dead server with backoff for minutes by default; a user waiting on promote should
# hear within seconds (the reachability probe below catches the common case before any request).
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")

import mlflow  # noqa: E402
from mlflow import MlflowClient  # noqa: E402
from mlflow.entities import LoggedModel, Metric, Param, Run  # noqa: E402
from mlflow.entities.model_registry import ModelVersion, RegisteredModel  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402

from pipeline.errors import DraftlineError, redact_url  # noqa: E402
from pipeline.tracking import (  # noqa: E402
    TAG_MODEL_IDENTITY,
    TAG_STAGE,
    check_artifact_location,
    check_store,
    sqlite_artifact_root,
    sqlite_path,
)

for _logger in ("mlflow", "alembic"):
    logging.getLogger(_logger).setLevel(logging.WARNING)

CHAMPION = "champion"
PREVIOUS_CHAMPION = "previous_champion"

TAG_OWNER = "draftline.owner"  # on the registered model: draftline created it (or was told to adopt it)
OWNER = "draftline"
ADOPT_FLAG = "--adopt-foreign-model"
_DESCRIPTION = ("Speculative-decoding drafter registered by draftline; alias `champion` marks the version that "
                "passed the promotion gate (or was forced by hand: see its gate.forced_reason tag).")

TAG_KIND = "draftline.kind"
TAG_EVAL_KEY = "draftline.eval_key"
TAG_TRAIN_RUN = "draftline.train_run_id"
TAG_GATE = "gate"  # promoted | rejected | forced
TAG_GATE_REASONS = "gate.reasons"
TAG_GATE_DECISION = "gate.decision"  # the full decision as JSON, so a rerun can report it unchanged
VERDICT_TAG_PREFIX = "gate.verdict."  # + T<temperature>/<domain>: passed | undecided | rejected
METRIC_TAG_PREFIX = "metric."

_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_KEY_UNSAFE = re.compile(r"[^\w./ :-]+")


def registered_model_name(prefix: str, verifier_id: str, kind: str) -> str:
    """`<prefix>-<verifier id>-<kind>` with anything outside [A-Za-z0-9._-] collapsed to '-' (a
    verifier id like `Qwen/Qwen3-0.6B` would otherwise break `models:/<name>@alias` URIs)."""
    parts = (_NAME_UNSAFE.sub("-", part).strip("-.") for part in (prefix, verifier_id, kind))
    return "-".join(part for part in parts if part)


def tag_key(key: str) -> str:
    """An MLflow-valid tag/metric/param key: anything but letters, digits, `_ - . / :` and spaces becomes `_`.

    Keys embed names read from files, not chosen here: the stage names of `dvc.lock` (read as found:
    DVC names a templated stage like `stage@item`, though this project's dvc.yaml has none) and
    the `skipped` entries of an export manifest. MLflow refuses any other character, and with one bad
    key a whole `log_batch`."""
    return _KEY_UNSAFE.sub("_", key)


def metric_tags(metrics: Mapping[str, float]) -> dict[str, str]:
    return {f"{METRIC_TAG_PREFIX}{name}": repr(float(value)) for name, value in metrics.items()}


def metrics_from_tags(tags: Mapping[str, str]) -> dict[str, float]:
    """Inverse of `metric_tags`; an unparsable value reads as NaN so the gate treats it as missing."""
    metrics = {}
    for key, value in tags.items():
        if key.startswith(METRIC_TAG_PREFIX):
            try:
                metrics[key.removeprefix(METRIC_TAG_PREFIX)] = float(value)
            except ValueError:
                metrics[key.removeprefix(METRIC_TAG_PREFIX)] = math.nan
    return metrics


def verdict_tags(verdicts: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """The gate's verdict per temperature and domain as tags (on the version and its evaluation run)."""
    return {f"{VERDICT_TAG_PREFIX}T{temperature}/{domain}": verdict
            for temperature, by_domain in verdicts.items() for domain, verdict in by_domain.items()}


def verdicts_from_tags(tags: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Inverse of `verdict_tags`: temperature -> domain -> verdict (empty for a version gated before them)."""
    out: dict[str, dict[str, str]] = {}
    for key, verdict in sorted(tags.items()):
        cell, slash, domain = key.removeprefix(VERDICT_TAG_PREFIX).partition("/")
        if key.startswith(VERDICT_TAG_PREFIX) and cell.startswith("T") and slash:
            out.setdefault(cell[1:], {})[domain] = verdict
    return out


LOCK_TIMEOUT_S = 600.0


@contextlib.contextmanager
def registry_lock(uri: str) -> Iterator[None]:
    """Serialises check-then-register across processes: two `promote` runs on the same evaluation
    would otherwise both miss the existing version and register duplicates. The lock file sits next
    to an sqlite store; for a server it is per user and host (runs on other hosts are not covered)."""
    database = sqlite_path(uri)
    if database is not None:
        lock_path = database.with_name(f"{database.name}.draftline.lock")
    else:
        lock_path = Path.home() / ".cache" / "draftline" / f"registry-{hashlib.sha256(uri.encode()).hexdigest()[:16]}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_path), timeout=LOCK_TIMEOUT_S)
    try:
        lock.acquire()
    except Timeout:
        raise DraftlineError(
            f"another promotion has held {lock_path} for {LOCK_TIMEOUT_S:.0f} s; wait for it, or delete the lock "
            "file if no draftline process is running"
        ) from None
    except OSError as error:  # a directory, or a symlink (never followed) where the lock file belongs
        raise DraftlineError(f"cannot take the promotion lock {lock_path} ({error.strerror or error}); it must be "
                             "a plain file: remove what is there if no draftline process is running") from None
    try:
        yield
    finally:
        lock.release()


class Registry:
    """A tracking + registry client bound to one URI (also set as MLflow's process-wide URI,
    because the sqlite registry store resolves logged models through the global client)."""

    def __init__(self, uri: str):
        check_store(uri)
        self.uri = uri
        mlflow.set_tracking_uri(uri)
        mlflow.set_registry_uri(uri)
        self.client = MlflowClient(tracking_uri=uri, registry_uri=uri)

    # ----------------------------------------------------------------- tracking

    def experiment_id(self, name: str) -> str:
        experiment = self.client.get_experiment_by_name(name)
        if experiment is None:
            return self.client.create_experiment(name, artifact_location=sqlite_artifact_root(self.uri))
        if experiment.lifecycle_stage == "deleted":
            raise DraftlineError(
                f"MLflow experiment '{name}' is deleted; restore it (`mlflow experiments restore`) "
                "or set tracking.experiment to another name"
            )
        check_artifact_location(self.uri, name, experiment.artifact_location)
        return experiment.experiment_id

    def find_training_run(self, experiment_id: str, identity: str) -> Run | None:
        """The latest finished training run that wrote the checkpoint with this identity, or None."""
        if not identity:
            return None
        found = self.client.search_runs(
            [experiment_id], max_results=1, order_by=["attributes.start_time DESC"],
            filter_string=f"tags.`{TAG_MODEL_IDENTITY}` = '{identity}' and tags.`{TAG_STAGE}` = 'train' "
                          "and attributes.status = 'FINISHED'",
        )
        return found[0] if found else None

    def start_run(self, experiment_id: str, name: str, tags: Mapping[str, str], parent: Run | None) -> Run:
        tags = dict(tags)
        if parent is not None and parent.info.experiment_id == experiment_id:
            tags["mlflow.parentRunId"] = parent.info.run_id  # nests the run under training in the UI
        return self.client.create_run(experiment_id, tags=tags, run_name=name)

    def log_run_values(self, run_id: str, metrics: Mapping[str, float | list[float]], params: Mapping[str, object],
                       model_id: str | None = None) -> None:
        """Finite metrics only (a list becomes one series over steps); params as strings."""
        timestamp = int(time.time() * 1000)
        entries = []
        for key, value in metrics.items():
            series = value if isinstance(value, list) else [value]
            entries += [
                Metric(tag_key(key), float(item), timestamp, step, model_id=model_id)
                for step, item in enumerate(series)
                if isinstance(item, (int, float)) and not isinstance(item, bool) and math.isfinite(item)
            ]
        self.client.log_batch(
            run_id, metrics=entries, params=[Param(tag_key(k), str(v)) for k, v in params.items()], synchronous=True
        )

    def log_drafter_model(self, experiment_id: str, run_id: str, kind: str, checkpoint: Path,
                          tags: Mapping[str, str]) -> LoggedModel:
        """The checkpoint directory as an MLflow 3 logged model, typed by its HF `model_type`."""
        hf_type = json.loads((checkpoint / "config.json").read_text(encoding="utf-8")).get("model_type", "unknown")
        model = self.client.create_logged_model(
            experiment_id, name=f"{kind}-drafter", source_run_id=run_id, tags=dict(tags),
            model_type=f"hf-checkpoint:{hf_type}",
        )
        try:
            self.client.log_model_artifacts(model.model_id, str(checkpoint))
        except BaseException:
            self.client.finalize_logged_model(model.model_id, "FAILED")
            raise
        return self.client.finalize_logged_model(model.model_id, "READY")

    # ----------------------------------------------------------------- registry

    def registered_model(self, name: str) -> RegisteredModel | None:
        try:
            return self.client.get_registered_model(name)
        except MlflowException:
            return None

    def owns(self, model: RegisteredModel) -> bool:
        """Created by draftline: the owner tag, or (registered before that tag existed) draftline's
        description with draftline's kind tag on every version."""
        if model.tags.get(TAG_OWNER) == OWNER:
            return True
        versions = self.versions(model.name)
        return (model.description or "").startswith(_DESCRIPTION[:40]) and all(TAG_KIND in v.tags for v in versions)

    def check_owned(self, name: str, adopt: bool = False) -> None:
        """A model of the same name that someone else registered is never gated against, aliased or
        extended unless the user says so (`adopt`: it is tagged as draftline's from then on)."""
        model = self.registered_model(name)
        if model is None or self.owns(model):
            return
        if not adopt:
            raise DraftlineError(
                f"registered model '{name}' was not created by draftline (no {TAG_OWNER} tag, versions without "
                f"{TAG_KIND}); set promote.model_name_prefix to another name, or pass {ADOPT_FLAG} to let "
                "draftline register and move aliases in it"
            )
        self.client.set_registered_model_tag(name, TAG_OWNER, OWNER)

    def create_version(self, name: str, model: LoggedModel, run_id: str, tags: Mapping[str, str],
                       description: str) -> ModelVersion:
        if self.registered_model(name) is None:
            self.client.create_registered_model(name, tags={TAG_OWNER: OWNER}, description=_DESCRIPTION)
        return self.client.create_model_version(
            name, source=f"models:/{model.model_id}", run_id=run_id, tags=dict(tags),
            description=description, model_id=model.model_id,
        )

    def find_version(self, name: str, value: str, tag: str = TAG_EVAL_KEY) -> ModelVersion | None:
        """The oldest version whose tag `tag` is `value`."""
        found = self.client.search_model_versions(f"name = '{name}' and tags.`{tag}` = '{value}'")
        return min(found, key=lambda version: int(version.version)) if found else None

    def version(self, name: str, version: str) -> ModelVersion:
        version = version_number(version)
        try:
            return self.client.get_model_version(name, str(version))
        except MlflowException:
            raise DraftlineError(
                f"registered model '{name}' has no version {version}; see `draftline registry show {name}`"
            ) from None

    def versions(self, name: str) -> list[ModelVersion]:
        found = self.client.search_model_versions(f"name = '{name}'")
        return sorted(found, key=lambda version: int(version.version))

    def alias_version(self, name: str, alias: str) -> ModelVersion | None:
        try:
            return self.client.get_model_version_by_alias(name, alias)
        except MlflowException:
            return None

    def models(self, prefix: str = "") -> list[RegisteredModel]:
        found = self.client.search_registered_models(filter_string=f"name LIKE '{prefix}%'", max_results=1000)
        return sorted(found, key=lambda model: model.name)

    def tag_version(self, name: str, version: str, tags: Mapping[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_model_version_tag(name, str(version), key, value)

    def replace_version_tags(self, version: ModelVersion, prefixes: tuple[str, ...], tags: Mapping[str, str]) -> None:
        """`version`'s tags under `prefixes` become `tags`: those `tags` lacks are deleted."""
        name, number = version.name, str(version.version)
        for key in version.tags:
            if key.startswith(prefixes) and key not in tags:
                self.client.delete_model_version_tag(name, number, key)
        self.tag_version(name, number, tags)

    def replace_run_tags(self, run_id: str, prefix: str, tags: Mapping[str, str]) -> None:
        """Sets `tags` on the run; its other tags under `prefix` are deleted."""
        for key in self.client.get_run(run_id).data.tags:
            if key.startswith(prefix) and key not in tags:
                self.client.delete_tag(run_id, key)
        for key, value in tags.items():
            self.client.set_tag(run_id, key, value)

    def set_champion(self, name: str, version: str) -> str | None:
        """Move `champion` to `version`; the version it leaves keeps `previous_champion`.
        Returns the previous champion's version (None when there was none or it is the same)."""
        version = version_number(version)
        current = self.alias_version(name, CHAMPION)
        if current is not None and str(current.version) == version:
            return None
        if current is not None:
            self.client.set_registered_model_alias(name, PREVIOUS_CHAMPION, str(current.version))
        else:
            self._drop_alias(name, PREVIOUS_CHAMPION, version)
        self.client.set_registered_model_alias(name, CHAMPION, version)
        return str(current.version) if current is not None else None

    def demote_champion(self, name: str, version: str) -> str | None:
        """`version` loses `champion`; `previous_champion` (when another version holds it) becomes the
        champion again and the alias is dropped, so it never names the champion. Returns the restored
        version, or None (no champion left)."""
        version = version_number(version)
        current = self.alias_version(name, CHAMPION)
        if current is None or str(current.version) != version:
            return None
        previous = self.alias_version(name, PREVIOUS_CHAMPION)
        if previous is not None:
            self.client.delete_registered_model_alias(name, PREVIOUS_CHAMPION)
        if previous is None or str(previous.version) == version:
            self.client.delete_registered_model_alias(name, CHAMPION)
            return None
        self.client.set_registered_model_alias(name, CHAMPION, str(previous.version))
        return str(previous.version)

    def _drop_alias(self, name: str, alias: str, version: str) -> None:
        held = self.alias_version(name, alias)
        if held is not None and str(held.version) == version:
            self.client.delete_registered_model_alias(name, alias)


def version_number(text: object) -> str:
    """A registered version as MLflow numbers it: `1`, `27`. MLflow itself reads `00001` or `+1` as 1,
    so a typed `00001` would pass every string comparison draftline makes against `1`."""
    text = str(text)
    if not re.fullmatch(r"[1-9][0-9]{0,17}", text):
        raise DraftlineError(f"version must be a whole number like 1 or 12 (as `draftline registry show` lists "
                             f"them), got '{text}'")
    return text


@contextlib.contextmanager
def mlflow_errors(uri: str) -> Iterator[None]:
    """An MLflow failure (server down, bad URI, store locked) is a one-line user error."""
    try:
        yield
    except MlflowException as error:
        message = str(error.message).splitlines()[0] if error.message else type(error).__name__
        raise DraftlineError(
            f"MLflow at {redact_url(uri)}: {message}; check tracking.uri / $MLFLOW_TRACKING_URI"
        ) from None
    except SQLAlchemyError as error:
        first_line = str(error.orig if getattr(error, "orig", None) else error).splitlines()[0]
        if "locked" in first_line:  # transient: the advice below would throw a healthy registry away
            raise DraftlineError(f"MLflow store {uri} is locked by another process ({first_line}); its registry "
                                 "is intact: wait for that process to finish and rerun") from None
        raise DraftlineError(
            f"MLflow store {uri} is unreadable ({first_line}); restore it from a backup, or move it away to "
            "start a new, empty registry"
        ) from None
