"""Stage `promote`: register every evaluated drafter in MLflow and run the promotion gate.

For each drafter in `metrics/eval.json`: one MLflow run (child of its training run when that run is
in the same experiment) holding the evaluation metrics, inputs and the serving checkpoint as a logged
model, registered as a new version of `<prefix>-<verifier id>-<kind>`. The gate decides whether the
`champion` alias moves to it, and its verdict is kept per temperature and domain (the floors hold at each
temperature of `promote.temperatures`, default every one evaluate runs). Keyed by (eval.json hash, kind,
checkpoint identity), so rerunning on the same evaluation finds the version it registered before and changes
nothing, unless the gate itself (`promote` thresholds and temperatures) or the evidence bound to it changed:
then that version is gated again. A checkpoint already registered with other metrics is not registered
again: its metric tags are replaced by the new evidence (eval.json numbers, serve_check's τ) and it is
gated on them, so new evidence against a champion demotes it (the previous champion is restored, the
reason tagged). A registered model of the same name that draftline did not create is refused unless
`--adopt-foreign-model` is given. A new verifier means a new registered model: its first promotion names
the previous verifier's champion, which it is not compared against.
Metrics are bound to artifacts: eval.json and serving.json record the identities of the drafter, export
and verifier they measured, and a drafter whose files differ now is refused before registration.
With `serve_check.required` (the default) a drafter whose stage `serve_check` did not pass (it did not
load in vLLM, its outputs differed, or it was skipped) is refused too; pass/fail is rederived from the
recorded outputs and τ, not read from the recorded status.

Design: docs/algorithms.md#promotion-gate.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import yaml
from rich.table import Table

from pipeline.atomic import write_json_atomic
from pipeline.cli import run_stage, stage_parser
from pipeline.config.base import DRAFTER_NAMES
from pipeline.config.evaluate_config import EvaluateConfig
from pipeline.config.promote_config import PromoteConfig
from pipeline.config.serve_check_config import ServeCheckConfig
from pipeline.config.stage_params import StageParams
from pipeline.config.tracking_config import TrackingConfig
from pipeline.errors import DraftlineError, redact_url
from pipeline.integrity import measured_artifacts, safetensors_shapes, verify_manifest
from pipeline.lineage import hash_file, library_versions, model_identity, read_json, version_tags
from pipeline.paths import ArtifactPaths
from pipeline.progress import console
from pipeline.promote.gate import GateDecision, decide, gate_metrics, is_finite, metric_key
from pipeline.promote.model_registry import (
    ADOPT_FLAG,
    CHAMPION,
    METRIC_TAG_PREFIX,
    PREVIOUS_CHAMPION,
    TAG_EVAL_KEY,
    TAG_GATE,
    TAG_GATE_DECISION,
    TAG_GATE_REASONS,
    TAG_KIND,
    TAG_TRAIN_RUN,
    VERDICT_TAG_PREFIX,
    ModelVersion,
    Registry,
    metric_tags,
    metrics_from_tags,
    mlflow_errors,
    registered_model_name,
    registry_lock,
    tag_key,
    verdict_tags,
)
from pipeline.serving_rule import domain_failures, sampled_verification_defect
from pipeline.tracking import TAG_MODEL_IDENTITY, TAG_STAGE, checked_tracking_uri
from pipeline.verifier_record import verifier_identity


class PromoteParams(StageParams):
    tracking: TrackingConfig = TrackingConfig()
    serve_check: ServeCheckConfig = ServeCheckConfig()
    promote: PromoteConfig = PromoteConfig()
    evaluate: EvaluateConfig = EvaluateConfig()  # its temperatures are the gate's when promote names none

    @property
    def gate_temperatures(self) -> list[str]:
        return self.promote.gated_temperatures(self.evaluate.temperatures)

DVC_LOCK = Path("dvc.lock")
TAG_GATE_KEY = "gate.key"  # hash of the gate (promote thresholds and temperatures) the decision was made under
TAG_DEMOTED = "gate.demoted_reason"  # why a champion lost the alias on new evidence
SERVE_CHECK_TAG_PREFIX = "serve_check."
EVIDENCE_TAG_PREFIXES = (METRIC_TAG_PREFIX, SERVE_CHECK_TAG_PREFIX)  # what the gate decides on


def _evaluation_entry(entry: object) -> bool:
    """An eval.json drafter entry of the expected shape: by_temperature -> domain -> metric (values are
    judged by the gate; a wrong shape would be an AttributeError wherever it is first walked)."""
    if not isinstance(entry, dict):
        return False
    by_temperature = entry.get("by_temperature", {})
    return isinstance(by_temperature, dict) and all(
        isinstance(by_domain, dict) and all(isinstance(values, dict) for values in by_domain.values())
        for by_domain in by_temperature.values())


@dataclass(frozen=True)
class Evaluation:
    """`metrics/eval.json`, checked for the keys promotion relies on."""

    path: Path
    sha256: str
    verifier_id: str
    verifier_hash: str
    corpus_hash: str
    drafters: dict[str, dict]

    @classmethod
    def load(cls, path: Path) -> "Evaluation":
        if not path.is_file():
            raise DraftlineError(f"{path} not found; run `dvc repro evaluate` (or `draftline evaluate`) first")
        try:
            data = read_json(path)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise DraftlineError(f"{path} is not valid JSON ({error}); rerun `draftline evaluate`") from None
        verifier = data.get("verifier") if isinstance(data, dict) else None
        drafters = data.get("drafters") if isinstance(data, dict) else None
        if not isinstance(verifier, dict) or not verifier.get("id") or not verifier.get("hash"):
            raise DraftlineError(f"{path}: missing verifier.id / verifier.hash; rerun `draftline evaluate`")
        if not isinstance(drafters, dict) or not drafters:
            raise DraftlineError(f"{path}: no evaluated drafters under 'drafters'; rerun `draftline evaluate`")
        unknown = sorted(set(drafters) - set(DRAFTER_NAMES))
        if unknown:
            raise DraftlineError(f"{path}: unknown drafter kind(s) {unknown}; expected {list(DRAFTER_NAMES)}")
        malformed = sorted(kind for kind, entry in drafters.items() if not _evaluation_entry(entry))
        if malformed:
            raise DraftlineError(f"{path}: the entry of {malformed} is not an object of by_temperature -> domain -> "
                                 "metrics; rerun `draftline evaluate`")
        return cls(path, hash_file(path), str(verifier["id"]), str(verifier["hash"]),
                   str(data.get("corpus_hash", "")), drafters)


def drafter_checkpoint(paths: ArtifactPaths, kind: str) -> tuple[Path, str]:
    """The serving checkpoint from `export`, else the training output (recorded as `source`)."""
    serving = paths.export(kind) / "serving"
    if (serving / "config.json").is_file():
        verify_manifest(paths.export(kind))  # never register a checkpoint damaged after export
        return serving, "export"
    trained = paths.drafter(kind)
    if (trained / "config.json").is_file():
        safetensors_shapes(trained, f"retrain it (`dvc repro train_{kind}`)")  # its identity reads every tensor
        return trained, "drafter"
    raise DraftlineError(
        f"no checkpoint for the {kind} drafter ({serving} and {trained} have no config.json); "
        f"run `dvc repro` up to the export stage"
    )


def load_training(paths: ArtifactPaths, kind: str, evaluation: Evaluation) -> dict:
    path = paths.drafter(kind) / "training.json"
    if not path.is_file():
        raise DraftlineError(f"{path} not found; train the {kind} drafter first (`draftline train --drafter {kind}`)")
    try:
        training = read_json(path)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DraftlineError(f"{path} is not valid JSON ({error}); retrain the {kind} drafter") from None
    if not isinstance(training, dict) or not isinstance(training.get("lineage", {}), dict):
        raise DraftlineError(f"{path} is not a training record; retrain the {kind} drafter")
    trained_on = (training.get("lineage") or {}).get("verifier_hash")
    if trained_on and trained_on != evaluation.verifier_hash:
        raise DraftlineError(
            f"the {kind} drafter was trained against verifier {trained_on} but evaluated against "
            f"{evaluation.verifier_hash}; run `dvc repro` so training and evaluation agree"
        )
    return training


def dvc_stage_hashes(lock_path: Path = DVC_LOCK) -> dict[str, str]:
    """One hash per stage in dvc.lock over its recorded deps and outs: equal hashes, equal stage."""
    if not lock_path.is_file():
        return {}
    stages = (yaml.safe_load(lock_path.read_text(encoding="utf-8")) or {}).get("stages") or {}
    return {
        name: hashlib.sha256(
            json.dumps({"deps": entry.get("deps"), "outs": entry.get("outs")}, sort_keys=True).encode()
        ).hexdigest()[:16]
        for name, entry in sorted(stages.items())
        if isinstance(entry, dict)
    }


def export_tags(paths: ArtifactPaths, kind: str) -> dict[str, str]:
    export_dir = paths.export(kind)
    tags = {
        "export.onnx": str(export_dir / "model.onnx") if (export_dir / "model.onnx").is_file() else "absent",
        "export.engine": str(export_dir / "engine.plan") if (export_dir / "engine.plan").is_file() else "absent",
    }
    manifest = export_dir / "manifest.json"
    if manifest.is_file():
        tags["export.manifest_sha256"] = hash_file(manifest)
        skipped = read_json(manifest).get("skipped") or {}
        if isinstance(skipped, dict):
            tags.update({tag_key(f"export.skipped.{what}"): str(why) for what, why in skipped.items()})
    return tags


def served_tau(paths: ArtifactPaths, kind: str) -> dict[str, dict]:
    """Per domain, τ as vLLM served the drafter in serve_check (batched: what a server gets; one request at
    a time) next to draftline's τ on the same prompts; empty without a serve_check record."""
    path = paths.metrics / "serving.json"
    if not path.is_file():
        return {}
    report = read_json(path)
    domains = ((report.get("drafters") or {}).get(kind) or {}).get("domains") or {}
    return {domain: {"vllm_batched": record.get("batched", {}).get("vllm", {}).get("tau"),
                     "vllm_single": record.get("single", {}).get("vllm", {}).get("tau"),
                     "draftline": record.get("draftline", {}).get("tau"), "concurrency": report.get("concurrency")}
            for domain, record in domains.items()}


def served_tau_tags(paths: ArtifactPaths, kind: str) -> dict[str, str]:
    tags = {}
    for domain, taus in served_tau(paths, kind).items():
        tags[tag_key(f"{SERVE_CHECK_TAG_PREFIX}{domain}.served_tau")] = str(taus["vllm_batched"])
        tags[tag_key(f"{SERVE_CHECK_TAG_PREFIX}{domain}.served_tau_single")] = str(taus["vllm_single"])
        tags[tag_key(f"{SERVE_CHECK_TAG_PREFIX}{domain}.draftline_tau")] = str(taus["draftline"])
    return tags


def evidence_tags(paths: ArtifactPaths, evaluation: Evaluation, kind: str) -> dict[str, str]:
    """What the gate is decided on, as version tags: the evaluation's gate metrics and serve_check's τ."""
    metrics = {**gate_metrics(evaluation.drafters[kind]), "max_tau": max_tau(paths, kind)}
    return {**metric_tags(metrics), **served_tau_tags(paths, kind)}


def recorded_evidence(tags: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in tags.items() if key.startswith(EVIDENCE_TAG_PREFIXES)}


def run_metrics(drafter_eval: dict) -> dict[str, float | list[float]]:
    """Every numeric evaluation value, keyed `T<temperature>/<domain>/<metric>` as the gate's metrics are."""
    metrics: dict[str, float | list[float]] = {"mismatches": drafter_eval.get("mismatches")}
    for temperature, by_domain in (drafter_eval.get("by_temperature") or {}).items():
        for domain, values in (by_domain or {}).items():
            for name, value in (values or {}).items():
                metrics[metric_key(temperature, domain, name)] = value
    return metrics


def gate_params(params: PromoteParams) -> dict[str, object]:
    config = params.promote
    out: dict[str, object] = {"gate.require_lossless": config.require_lossless,
                              "gate.max_regression": config.max_regression,
                              "gate.temperatures": ", ".join(params.gate_temperatures)}
    for domain, floors in [("default_gate", config.default_gate), *sorted(config.gates.items())]:
        out[f"gate.{domain}.min_tau"] = floors.min_tau
        out[f"gate.{domain}.min_speedup"] = floors.min_speedup
    return out


def gate_key(params: PromoteParams) -> str:
    """The gate that made a decision (floors and the temperatures they apply at): a version's decision
    stands only while this is unchanged."""
    return hashlib.sha256(json.dumps(gate_params(params), sort_keys=True).encode()).hexdigest()[:16]


def _version_record(registry: Registry, name: str, version: str, decision: GateDecision,
                    already_registered: bool, regated: str | None = None) -> dict:
    current = registry.version(name, version)
    champion = registry.alias_version(name, CHAMPION)
    previous = registry.alias_version(name, PREVIOUS_CHAMPION)
    return {
        "model_name": name,
        "version": str(version),
        "model_uri": f"models:/{name}/{version}",
        "decision": current.tags.get(TAG_GATE, decision.outcome),
        "promoted": decision.promote,
        "reasons": decision.reasons,
        "undecided": decision.undecided,
        "verdicts": decision.verdicts(),
        "comparisons": [comparison.to_dict() for comparison in decision.comparisons],
        "compared_with_champion": decision.champion_version,
        "champion_version": str(champion.version) if champion else None,
        "previous_champion_version": str(previous.version) if previous else None,
        "already_registered": already_registered,
        "regated": regated is not None,
        "regated_because": regated,
        "source": current.tags.get("draftline.source"),
        "source_path": current.tags.get("draftline.source_path"),
        "run_id": current.run_id,
    }


def _register(registry: Registry, params: PromoteParams, paths: ArtifactPaths, evaluation: Evaluation, kind: str,
              name: str, eval_key: str, checkpoint: Path, source: str, identity: str) -> str:
    """One run + logged model + registered version for this drafter; returns the version number."""
    training = load_training(paths, kind, evaluation)
    lineage = training.get("lineage") or {}
    drafter_eval = evaluation.drafters[kind]
    experiment_id = registry.experiment_id(params.tracking.experiment)
    train_run = registry.find_training_run(experiment_id, drafter_eval["drafter_identity"])

    tags = {
        TAG_KIND: kind,
        TAG_EVAL_KEY: eval_key,
        "draftline.source": source,
        "draftline.source_path": str(checkpoint),
        TAG_MODEL_IDENTITY: identity,
        "draftline.eval_sha256": evaluation.sha256,
        "draftline.backend": str(drafter_eval.get("backend", "unknown")),
        TAG_TRAIN_RUN: train_run.info.run_id if train_run else "none",
        "lineage.verifier_id": evaluation.verifier_id,
        "lineage.verifier_hash": evaluation.verifier_hash,
        "lineage.corpus_hash": str(lineage.get("corpus_hash") or evaluation.corpus_hash),
        "lineage.params_hash": str(lineage.get("params_hash", "unknown")),
        "lineage.git_commit": str(lineage.get("git_commit", "unknown")),
        **{tag_key(f"dvc.{stage}"): digest for stage, digest in dvc_stage_hashes().items()},
        **export_tags(paths, kind),
        **version_tags(),
    }
    if train_run is None:
        tags["draftline.train_run_found"] = "false"  # trained against another tracking store or experiment

    run = registry.start_run(experiment_id, f"promote-{kind}", {**tags, TAG_STAGE: "promote"}, train_run)
    run_id = run.info.run_id
    try:
        model = registry.log_drafter_model(experiment_id, run_id, kind, checkpoint, tags)
        registry.log_run_values(run_id, run_metrics(drafter_eval), gate_params(params), model_id=model.model_id)
        inputs = [evaluation.path, paths.drafter(kind) / "training.json", paths.export(kind) / "manifest.json", DVC_LOCK]
        for path in inputs:
            if path.is_file():
                registry.client.log_artifact(run_id, str(path), artifact_path="inputs")
        version = registry.create_version(
            name, model, run_id, {**tags, **evidence_tags(paths, evaluation, kind)},
            description=f"{kind} drafter for verifier {evaluation.verifier_id}, evaluated at "
            f"T={', '.join(drafter_eval.get('by_temperature', {})) or '-'} (eval.json {evaluation.sha256[:12]}), "
            f"checkpoint from {source}; the gate's verdict per temperature and domain: the tags "
            f"{VERDICT_TAG_PREFIX}T<temperature>/<domain>",
        )
    except BaseException:
        registry.client.set_terminated(run_id, status="FAILED")
        raise
    registry.client.set_terminated(run_id)
    return str(version.version)


def gate_version(registry: Registry, params: PromoteParams, name: str, version: str) -> GateDecision:
    """Run the gate on a registered version against the current champion, then move aliases/tag it."""
    candidate = registry.version(name, version)
    champion = registry.alias_version(name, CHAMPION)
    is_champion = champion is not None and str(champion.version) == version
    if is_champion:
        champion = None  # a version never regresses against itself
    decision = decide(
        metrics_from_tags(candidate.tags), params.promote, params.gate_temperatures,
        metrics_from_tags(champion.tags) if champion else None,
        str(champion.version) if champion else None,
    )
    tags = {
        TAG_GATE: decision.outcome,
        TAG_GATE_REASONS: "; ".join(decision.reasons or decision.undecided) or "all thresholds passed",
        TAG_GATE_DECISION: json.dumps(decision.to_dict(), sort_keys=True),
        TAG_GATE_KEY: gate_key(params),
    }
    if decision.promote:
        registry.set_champion(name, version)
    elif is_champion and decision.reasons:  # undecided is no evidence against it: it stays champion
        tags[TAG_DEMOTED] = demote(registry, name, version, "; ".join(decision.reasons))
    registry.tag_version(name, version, tags)
    # a temperature dropped from the list leaves no verdict of an earlier gate behind
    verdicts = verdict_tags(decision.verdicts())
    registry.replace_version_tags(candidate, (VERDICT_TAG_PREFIX,), verdicts)
    if candidate.run_id:
        registry.replace_run_tags(candidate.run_id, VERDICT_TAG_PREFIX, {TAG_GATE: decision.outcome, **verdicts})
    return decision


def demote(registry: Registry, name: str, version: str, reason: str) -> str:
    """The champion `version` fails on new evidence: it loses the alias; returns the reason as tagged."""
    restored = registry.demote_champion(name, version)
    back = f"v{restored} is champion again" if restored else "no previous champion to restore"
    return f"lost champion: {reason} ({back})"


def demote_refused_champion(registry: Registry, params: PromoteParams, evaluation: Evaluation, kind: str,
                            identity: str, reason: str) -> str | None:
    """serve_check now refuses the checkpoint that is the champion: the same new evidence as a failing
    gate. Returns what happened to the alias, or None when the checkpoint is not the champion."""
    name = registered_model_name(params.promote.model_name_prefix, evaluation.verifier_id, kind)
    model = registry.registered_model(name)
    if model is None or not registry.owns(model):  # not draftline's: its aliases are not ours to move
        return None
    champion = registry.alias_version(name, CHAMPION)
    if champion is None or champion.tags.get(TAG_MODEL_IDENTITY) != identity:
        return None
    demoted = demote(registry, name, str(champion.version), reason)
    registry.tag_version(name, str(champion.version), {TAG_GATE: "rejected", TAG_GATE_REASONS: reason,
                                                        TAG_DEMOTED: demoted})
    return f"{name} v{champion.version} {demoted}"


def other_verifier_champion(registry: Registry, params: PromoteParams, name: str, kind: str) -> str | None:
    """`models:/<model>@champion` of the most recently updated registered model of this kind under
    another verifier that has a champion, or None. Its metrics come from another verifier, so the gate
    never compares against it."""
    prefix = registered_model_name(params.promote.model_name_prefix, "", "")
    others = [model for model in registry.models(f"{prefix}-")
              if model.name != name and model.name.endswith(f"-{kind}")]
    for model in sorted(others, key=lambda model: model.last_updated_timestamp or 0, reverse=True):
        champion = registry.alias_version(model.name, CHAMPION)
        if champion is not None:
            return f"models:/{model.name}@{CHAMPION} (v{champion.version})"
    return None


def regate_reason(existing: ModelVersion, evidence: dict[str, str], params: PromoteParams) -> str | None:
    """Why a decided version is gated again: its evidence changed (even a forced one: the person decided
    on the old evidence), or the gate did, its thresholds or temperatures (a forced version is a person's
    decision: not then)."""
    if recorded_evidence(existing.tags) != evidence:
        return "new evaluation/serving evidence"
    if existing.tags.get(TAG_GATE_KEY) != gate_key(params) and existing.tags.get(TAG_GATE) != "forced":
        return "promote thresholds or temperatures changed"
    return None


def replace_evidence(registry: Registry, existing: ModelVersion, evidence: dict[str, str],
                     evaluation: Evaluation, eval_key: str) -> None:
    """The version's evidence tags become `evidence` (tags the new evidence lacks are deleted)."""
    registry.replace_version_tags(existing, EVIDENCE_TAG_PREFIXES, evidence)
    registry.tag_version(existing.name, str(existing.version),
                         {TAG_EVAL_KEY: eval_key, "draftline.eval_sha256": evaluation.sha256})


def promote_drafter(registry: Registry, params: PromoteParams, paths: ArtifactPaths, evaluation: Evaluation,
                    kind: str, adopt: bool = False) -> dict:
    name = registered_model_name(params.promote.model_name_prefix, evaluation.verifier_id, kind)
    registry.check_owned(name, adopt)
    checkpoint, source = drafter_checkpoint(paths, kind)
    identity = model_identity(checkpoint)
    eval_key = hashlib.sha256(f"{evaluation.sha256}:{kind}:{identity}".encode()).hexdigest()[:32]
    champion_before = registry.alias_version(name, CHAMPION)
    not_comparable = None if champion_before else other_verifier_champion(registry, params, name, kind)

    existing = registry.find_version(name, eval_key) or registry.find_version(name, identity, TAG_MODEL_IDENTITY)
    evidence = evidence_tags(paths, evaluation, kind)
    decided = existing is not None and TAG_GATE_DECISION in existing.tags
    regated = regate_reason(existing, evidence, params) if decided else None
    demoted = None
    if decided and regated is None:
        decision = GateDecision.from_dict(json.loads(existing.tags[TAG_GATE_DECISION]))
        version, already_registered = str(existing.version), True
    else:
        # A version without a decision is left over from an interrupted run, one decided on other
        # evidence or thresholds is re-gated on these: gate it again, don't duplicate it.
        if existing is not None and recorded_evidence(existing.tags) != evidence:
            replace_evidence(registry, existing, evidence, evaluation, eval_key)
        version = str(existing.version) if existing is not None else _register(
            registry, params, paths, evaluation, kind, name, eval_key, checkpoint, source, identity
        )
        decision = gate_version(registry, params, name, version)
        already_registered = existing is not None
        if champion_before is not None and str(champion_before.version) == version and decision.reasons:
            demoted = registry.version(name, version).tags.get(TAG_DEMOTED)
    record = _version_record(registry, name, version, decision, already_registered=already_registered,
                             regated=regated)
    record["other_verifier_champion"] = not_comparable
    record["demoted"] = demoted
    return record


def max_tau(paths: ArtifactPaths, kind: str) -> float:
    """The most tokens one verifier forward can commit with this drafter: its drafts per step, as the
    export serves it (`vllm.json`, covered by the verified manifest), plus the bonus token. Without an
    export only the global bound applies."""
    path = paths.export(kind) / "vllm.json"
    drafts = (read_json(path).get("speculative_config") or {}).get("num_speculative_tokens") if path.is_file() else None
    return float(drafts) + 1 if is_finite(drafts) and drafts >= 1 else math.nan


def _short(digest: object) -> str:
    return str(digest)[:12] if digest else "none"


def unbound_reason(source: str, recorded: dict, recorded_verifier: object, now: dict, verifier_hash: str) -> str | None:
    """Why metrics recorded in `source` were not measured on the artifacts promotion would register."""
    if recorded_verifier != verifier_hash:
        return (f"{source} was measured with verifier {_short(recorded_verifier)}, the verifier is now "
                f"{_short(verifier_hash)}; rerun `dvc repro`")
    for key, value in now.items():
        if recorded.get(key) != value:
            return (f"{source} measured {key} {_short(recorded.get(key))}, the files are now {_short(value)} "
                    f"(changed after it ran); rerun `dvc repro`")
    return None


def binding_refusals(paths: ArtifactPaths, evaluation: Evaluation, serving: dict | None,
                     kinds: list[str]) -> dict[str, str]:
    """kind -> why its metrics do not belong to the checkpoint promotion would register (recomputed now)."""
    verifier = verifier_identity(paths)
    verifier_hash = verifier["hash"]
    refusals = {}
    for kind in kinds:
        now = measured_artifacts(paths.drafter(kind), paths.export(kind))
        manifest = paths.export(kind) / "manifest.json"
        exported_from = ((read_json(manifest).get("lineage") or {}).get("drafter_hash")
                         if manifest.is_file() else now["drafter_identity"])
        reason = unbound_reason("metrics/eval.json", evaluation.drafters[kind], evaluation.verifier_hash, now,
                                verifier_hash)
        if reason is None and serving is not None:
            reason = unbound_reason("metrics/serving.json", (serving.get("drafters") or {}).get(kind) or {},
                                    serving.get("verifier_hash"), now, verifier_hash)
        if reason is None and evaluation.verifier_id != verifier["id"]:  # the registered model name comes from it
            reason = (f"metrics/eval.json names verifier {evaluation.verifier_id}, the verifier is {verifier['id']}; "
                      "rerun `dvc repro evaluate`")
        if reason is None and exported_from != now["drafter_identity"]:
            reason = (f"{paths.export(kind)} was exported from drafter {_short(exported_from)}, not from "
                      f"{paths.drafter(kind)} ({_short(now['drafter_identity'])}); rerun `dvc repro export`")
        if reason:
            refusals[kind] = reason
    return refusals


def read_serving(params: PromoteParams, paths: ArtifactPaths) -> dict | None:
    """`metrics/serving.json` when `serve_check.required`, else None."""
    if not params.serve_check.required:
        return None
    path = paths.metrics / "serving.json"
    if not path.is_file():
        raise DraftlineError(f"{path} not found; run `dvc repro serve_check` first "
                             "(or set serve_check.required: false to promote without the vLLM check)")
    try:
        serving = read_json(path)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DraftlineError(f"{path} is not valid JSON ({error}); rerun `dvc repro serve_check`") from None
    drafters = serving.get("drafters", {}) if isinstance(serving, dict) else None
    if not isinstance(drafters, dict) or not all(isinstance(entry, dict) for entry in drafters.values()):
        raise DraftlineError(f"{path} is not a serve_check report; rerun `dvc repro serve_check`")
    return serving


def serve_check_failure(entry: dict, config: ServeCheckConfig) -> str | None:
    """Pass/fail rederived from the recorded numbers by serve_check's own rule, never from the recorded
    `status` alone."""
    if entry.get("status") != "passed":
        return f"serve_check {entry.get('status')}: {entry.get('reason')}"
    domains = entry.get("domains")
    if not isinstance(domains, dict) or not domains:
        return "serve_check says passed but measured no domain"
    for domain, record in sorted(domains.items()):
        reasons = domain_failures(record if isinstance(record, dict) else {}, config.max_tau_gap,
                                  config.max_batch_tau_gap, config.sampled_z, config.gate_sampled)
        if reasons:
            return f"serve_check says passed but {domain}: {reasons[0]}"
    return launch_command_failure(entry.get("launch_command"), config)


def launch_command_failure(launch: object, config: ServeCheckConfig) -> str | None:
    """The run of launch.md's command (when serve_check made one), rederived like the in-process run."""
    if launch is None:
        return None
    what = "serve_check's run of launch.md's command"
    if not isinstance(launch, dict) or launch.get("status") != "passed" or launch.get("agrees_with_in_process") is not True:
        reason = launch.get("reason") or "; ".join(launch.get("disagreements") or []) if isinstance(launch, dict) else None
        return f"{what} did not pass: {reason or 'no reason recorded'}"
    domains = launch.get("domains")
    if not isinstance(domains, dict) or not domains:
        return f"{what} says passed but measured no domain"
    for domain, record in sorted(domains.items()):
        reasons = domain_failures(record if isinstance(record, dict) else {}, config.max_tau_gap,
                                  config.max_batch_tau_gap, config.sampled_z, config.gate_sampled)
        if reasons:
            return f"{what} says passed but {domain}: {reasons[0]}"
    return None


def serve_check_refusals(params: PromoteParams, serving: dict | None, kinds: list[str]) -> dict[str, str]:
    """kind -> why promotion refuses it: `serve_check.required` and its serve_check did not pass. Every engine
    that served the drafter (vLLM's `drafters`, llama.cpp's `llamacpp.drafters` when serve_check ran it) must
    pass; one that cannot serve it on this build (`skipped`) is left out, unless no engine served it. An engine whose
    recorded self-test shows it samples drafts its own way (a perfect drafter loses acceptance) is held to its
    greedy rules only."""
    if serving is None:
        return {}
    llamacpp = serving.get("llamacpp") or {}
    engines = {"vLLM": (serving.get("drafters"), params.serve_check),
               "llama.cpp": (llamacpp.get("drafters"), params.serve_check.model_copy(update={"gate_sampled": False})
                             if sampled_verification_defect(llamacpp.get("sampled_self_test")) else params.serve_check)}
    refusals = {}
    for kind in kinds:
        verdicts = []  # (engine, skipped, failure reason)
        for engine, (drafters, rule) in engines.items():
            if engine != "vLLM" and not isinstance(drafters, dict):
                continue  # a serving.json from before that engine was checked
            entry = (drafters or {}).get(kind)
            entry = entry if isinstance(entry, dict) else {"status": "missing",
                                                           "reason": f"no '{kind}' entry in metrics/serving.json"}
            verdicts.append((engine, entry.get("status") == "skipped", serve_check_failure(entry, rule)))
        served = [verdict for verdict in verdicts if not verdict[1]]
        named = [(engine, reason) for engine, _, reason in (served or verdicts) if reason]
        if named:
            refusals[kind] = "; ".join(reason if engine == "vLLM" else f"{engine}: {reason}" for engine, reason in named)
    return refusals


def comparisons_table(title: str, comparisons: list[dict]) -> Table:
    """One row per gate comparison (`Comparison.to_dict()` form: NaN already became None)."""
    table = Table(title=title, title_justify="left")
    for column in ("check", "metric", "value", "threshold", "pass"):
        table.add_column(column)
    for comparison in comparisons:
        value, threshold = comparison["value"], comparison["threshold"]
        table.add_row(
            comparison["check"], comparison["metric"],
            "missing/NaN" if value is None else f"{value:.4g}",
            "-" if threshold is None else f"{threshold:.4g}",
            "[green]yes[/]" if comparison["passed"] else "[yellow]undecided[/]" if comparison.get("undecided")
            else "[red]no[/]",
        )
    return table


VERDICT_STYLE = {"passed": "[green]passed[/]", "undecided": "[yellow]undecided[/]", "rejected": "[red]rejected[/]"}


def verdicts_table(verdicts: dict[str, dict[str, str]]) -> Table:
    """The gate's verdict per domain (rows) at each temperature (columns)."""
    table = Table(title="verdict per temperature and domain", title_justify="left")
    table.add_column("domain")
    for temperature in verdicts:
        table.add_column(f"T={temperature}")
    for domain in sorted({domain for by_domain in verdicts.values() for domain in by_domain}):
        table.add_row(domain, *(VERDICT_STYLE.get(by_domain.get(domain, "-"), "-") for by_domain in verdicts.values()))
    return table


def print_decision(kind: str, record: dict) -> None:
    verdict = ("[bold green]PROMOTED[/]" if record["promoted"] else "[bold red]REJECTED[/]" if record["reasons"]
               else "[bold yellow]UNDECIDED[/]")
    rerun = (f" (already registered: re-gated, {record['regated_because']})" if record["regated"]
             else " (already registered: no change)" if record["already_registered"] else "")
    title = f"{kind}: {record['model_name']} v{record['version']} {verdict}{rerun}"
    console.print(comparisons_table(title, record["comparisons"]))
    if record["verdicts"]:
        console.print(verdicts_table(record["verdicts"]))
    for reason in record["reasons"]:
        console.print(f"  [red]x[/] {reason}")
    for reason in record.get("undecided", []):
        console.print(f"  [yellow]?[/] {reason}")
    if record.get("undecided") and not record["reasons"]:
        console.print("  the speed gate cannot decide on timings this noisy (nothing registered as rejected, "
                      "the aliases stay): rerun `dvc repro evaluate` (or `draftline evaluate`) on a quiet machine, "
                      "or raise evaluate.timing_repeats, then promote again", soft_wrap=True)
    if record.get("demoted"):
        console.print(f"  [red]v{record['version']} {record['demoted']}[/]", soft_wrap=True)
    if record.get("other_verifier_champion"):
        console.print(f"  the champion under the previous verifier, {record['other_verifier_champion']}, is not "
                      f"comparable (another verifier): {record['model_name']} is gated on its own", soft_wrap=True)
    champion, previous = record["champion_version"], record["previous_champion_version"]
    console.print(f"  champion: {f'v{champion}' if champion else 'none'}  previous_champion: "
                  f"{f'v{previous}' if previous else 'none'}  ({record['model_uri']})")


def run(params: PromoteParams, args: argparse.Namespace) -> dict:
    paths = ArtifactPaths.from_params(params)
    evaluation = Evaluation.load(paths.metrics / "eval.json")
    kinds = sorted(evaluation.drafters)
    serving = read_serving(params, paths)
    binding = binding_refusals(paths, evaluation, serving, kinds)
    refusals = {**serve_check_refusals(params, serving, kinds), **binding}
    uri = checked_tracking_uri(params.tracking)
    adopt = getattr(args, "adopt_foreign_model", False)
    with mlflow_errors(uri), registry_lock(uri):
        registry = Registry(uri)
        records = {kind: promote_drafter(registry, params, paths, evaluation, kind, adopt)
                   for kind in sorted(evaluation.drafters) if kind not in refusals}
        for kind, reason in refusals.items():
            demoted = None
            if kind not in binding:  # serve_check's verdict on the very files: evidence against a champion
                demoted = demote_refused_champion(registry, params, evaluation, kind,
                                                  model_identity(drafter_checkpoint(paths, kind)[0]), reason)
            records[kind] = {"promoted": False, "decision": "refused", "reasons": [reason], "demoted": demoted}
    for kind, record in records.items():
        record["served_tau"] = served_tau(paths, kind)
    report = {
        "tracking_uri": redact_url(registry.uri),
        "experiment": params.tracking.experiment,
        "eval_sha256": evaluation.sha256,
        "library_versions": library_versions(),
        "drafters": records,
    }
    write_json_atomic(paths.metrics / "promotion.json", report)
    for kind, record in records.items():
        if record["decision"] == "refused":
            console.print(f"{kind}: [bold red]REFUSED[/] (not registered): {record['reasons'][0]}", highlight=False)
            if record["demoted"]:
                console.print(f"  [red]{record['demoted']}[/]", highlight=False, soft_wrap=True)
        else:
            print_decision(kind, record)
    console.print(f"MLflow UI: mlflow ui --backend-store-uri {redact_url(registry.uri)}")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("draftline promote", "Register evaluated drafters in MLflow and run the promotion gate.")
    parser.add_argument(ADOPT_FLAG, action="store_true", help="register into (and move the aliases of) a registered "
                        "model of the same name that draftline did not create; it is tagged as draftline's from then on")
    return run_stage(parser, PromoteParams, run, argv)


if __name__ == "__main__":
    sys.exit(main())
