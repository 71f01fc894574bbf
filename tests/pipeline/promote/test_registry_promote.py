"""Stage `promote` and `draftline registry` against a real MLflow sqlite store in a temp dir.

The inputs (eval.json, training.json, export manifest, dvc.lock) are fake but follow the contracts;
the AR checkpoint is a real tiny HF causal LM so loading `models:/<name>@champion` is checked for real.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from pipeline.lineage import model_identity
from pipeline.promote import promote, registry_cmd
from pipeline.promote.model_registry import CHAMPION, PREVIOUS_CHAMPION, Registry
from pipeline.verifier_record import write_record
from tests.support import REPO
from tests.support.promotion import EXPERIMENT, Workspace, domain_metrics, drafter_eval, ready_workspace
from tests.support.tiny_models import tiny_tokenizer


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    directory = tmp_path_factory.mktemp("mlflow_store")
    return f"sqlite:///{directory / 'mlflow.db'}"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tokenizer")
    tiny_tokenizer().save_pretrained(directory)
    return directory


def make_workspace(tmp_path_factory, store, tokenizer_dir, verifier_id) -> Workspace:
    return Workspace(tmp_path_factory.mktemp(verifier_id.replace("/", "_")), store, verifier_id, tokenizer_dir)


@pytest.fixture(scope="module")
def history(tmp_path_factory, store, tokenizer_dir):
    """good -> better -> worse -> NaN -> the NaN evaluation again, recording each promotion.json."""
    ws = make_workspace(tmp_path_factory, store, tokenizer_dir, "tiny/verifier")
    registry = Registry(store)
    experiment_id = registry.experiment_id(EXPERIMENT)
    ws.write_training("ar")
    ws.write_training("block")
    ws.write_block_checkpoint()
    # training tags its run with the checkpoint's identity; the block drafter's run is in no store here
    ar_identity = model_identity(ws.root / "artifacts/drafters/ar")
    train_run = registry.client.create_run(experiment_id, run_name="train-ar", tags={
        "draftline.stage": "train", "draftline.kind": "ar", "draftline.model_identity": ar_identity})
    registry.client.set_terminated(train_run.info.run_id)
    killed = registry.client.create_run(experiment_id, tags={  # a later run of the same weights that died
        "draftline.stage": "train", "draftline.kind": "ar", "draftline.model_identity": ar_identity})
    registry.client.set_terminated(killed.info.run_id, status="KILLED")
    steps = [("good", 2.0), ("better", 2.5), ("worse", 1.6), ("nan", math.nan)]
    out = {"ws": ws, "registry": registry, "train_run": train_run.info.run_id, "models": {}}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ws.root)
        for seed, (label, code_tau) in enumerate(steps):
            out["models"][label] = ws.write_ar_checkpoint(seed)
            speedup = None if label == "nan" else 1.3
            ws.write_eval({"ar": drafter_eval(code_tau, 1.8, speedup), "block": drafter_eval(2.0, 1.8)})
            out[label] = ws.promote()
        out["runs_before_rerun"] = len(registry.client.search_runs([experiment_id]))
        out["rerun"] = ws.promote()
        out["runs_after_rerun"] = len(registry.client.search_runs([experiment_id]))
    return out


def test_first_drafter_promotes_with_metrics_and_lineage(history):
    ar = history["good"]["drafters"]["ar"]
    assert ar["promoted"] and ar["decision"] == "promoted" and ar["reasons"] == []
    assert ar["version"] == "1" and ar["champion_version"] == "1" and ar["previous_champion_version"] is None
    assert ar["source"] == "export"
    assert {c["check"] for c in ar["comparisons"]} == {"lossless", "floor"}  # no champion yet to regress from
    version = history["registry"].version(history["ws"].name("ar"), "1")
    tags = version.tags
    assert float(tags["metric.T0.0/code/tau"]) == 2.0 and float(tags["metric.lossless"]) == 1.0
    assert float(tags["metric.T0.8/code/tau"]) == 2.0 and tags["gate.verdict.T0.8/code"] == "passed"
    assert tags["lineage.verifier_hash"] == history["ws"].verifier_hash and tags["lineage.git_commit"] == "abc123"
    assert tags["dvc.train_ar"] and tags["export.skipped.tensorrt"] == "no CUDA device"
    assert tags["export.onnx"] == "absent" and len(tags["export.manifest_sha256"]) == 64
    # the evaluation run is a child of the training run, so the drafter's history is one click away
    run = history["registry"].client.get_run(version.run_id)
    assert run.data.tags["mlflow.parentRunId"] == history["train_run"]
    assert run.data.metrics["T0.0/code/tau"] == 2.0 and run.data.params["gate.code.min_tau"] == "1.2"
    assert run.data.params["gate.temperatures"] == "0.0, 0.8" and run.data.tags["gate.verdict.T0.8/text"] == "passed"
    assert ar["verdicts"] == {"0.0": {"code": "passed", "text": "passed"}, "0.8": {"code": "passed", "text": "passed"}}
    logged = history["registry"].client.get_logged_model(version.source.removeprefix("models:/"))
    assert logged.source_run_id == version.run_id and logged.model_type == "hf-checkpoint:qwen3"


def test_block_falls_back_to_training_output_and_records_missing_training_run(history):
    block = history["good"]["drafters"]["block"]
    assert block["promoted"] and block["source"] == "drafter"
    assert block["model_name"] == history["ws"].name("block") and block["model_name"].startswith("dl-tiny-verifier-")
    tags = history["registry"].version(block["model_name"], block["version"]).tags
    assert tags["draftline.train_run_found"] == "false"
    assert tags["draftline.source_path"].endswith("artifacts/drafters/block")


def test_better_drafter_replaces_champion(history):
    ar = history["better"]["drafters"]["ar"]
    assert ar["promoted"] and ar["version"] == "2"
    assert ar["champion_version"] == "2" and ar["previous_champion_version"] == "1"
    assert ar["compared_with_champion"] == "1"
    assert {c["check"] for c in ar["comparisons"]} == {"lossless", "floor", "regression"}


def test_worse_drafter_is_rejected_with_reasons(history):
    ar = history["worse"]["drafters"]["ar"]
    assert not ar["promoted"] and ar["decision"] == "rejected" and ar["version"] == "3"
    assert ar["champion_version"] == "2"
    assert ar["reasons"] == [f"T={temperature} code tau 1.6 < 2.375 (champion v2 2.5 - 5%)" for temperature in ("0.0", "0.8")]
    tags = history["registry"].version(ar["model_name"], "3").tags
    assert tags["gate"] == "rejected" and "champion v2" in tags["gate.reasons"]


def test_nan_metrics_are_rejected(history):
    ar = history["nan"]["drafters"]["ar"]
    assert not ar["promoted"] and ar["version"] == "4" and ar["champion_version"] == "2"
    failed = {(c["check"], c["metric"]) for c in ar["comparisons"] if not c["passed"]}
    assert ("floor", "T0.0/code/tau") in failed and ("floor", "T0.8/code/speedup") in failed
    assert ("regression", "T0.0/text/speedup") in failed
    assert all(c["value"] is None for c in ar["comparisons"] if c["metric"] in ("T0.0/code/tau", "T0.0/code/speedup"))
    assert "missing/NaN" in history["registry"].version(ar["model_name"], "4").tags["gate.reasons"]


def test_rerun_is_a_no_op(history):
    first, again = history["nan"]["drafters"], history["rerun"]["drafters"]
    registry, name = history["registry"], history["ws"].name("ar")
    assert len(registry.versions(name)) == 4
    assert history["runs_after_rerun"] == history["runs_before_rerun"]
    assert not first["ar"]["already_registered"]
    assert first["block"]["already_registered"]  # the same block checkpoint in every step: one version
    assert len(registry.versions(history["ws"].name("block"))) == 1
    for kind in ("ar", "block"):
        assert again[kind]["already_registered"]
        assert {**again[kind], "already_registered": False} == {**first[kind], "already_registered": False}


def test_changed_gate_regates_the_same_version(tmp_path_factory, store, tokenizer_dir, capsys):
    ws = make_workspace(tmp_path_factory, store, tokenizer_dir, "regate")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ws.root)
        ws.write_ar_checkpoint(seed=3)
        ws.write_training("ar")
        ws.write_eval({"ar": drafter_eval(1.5, 1.5)})
        assert ws.promote()["drafters"]["ar"]["promoted"]
        params = yaml.safe_load(ws.params.read_text())
        params["promote"]["gates"]["code"]["min_tau"] = 1.8
        ws.params.write_text(yaml.safe_dump(params))
        capsys.readouterr()
        stricter = ws.promote()["drafters"]["ar"]
        assert not stricter["promoted"] and stricter["regated"] and stricter["version"] == "1"
        assert "T=0.0 code tau 1.5 < floor 1.8" in stricter["reasons"][0]
        assert "re-gated" in capsys.readouterr().err
        assert Registry(store).version(ws.name("ar"), "1").tags["gate"] == "rejected"
        again = ws.promote()["drafters"]["ar"]  # same gate again: the decision stands
        assert again["already_registered"] and not again["regated"] and not again["promoted"]
        assert len(Registry(store).versions(ws.name("ar"))) == 1


def test_champion_uri_loads_the_promoted_drafter(history, tmp_path):
    import mlflow
    from transformers import AutoModelForCausalLM

    name = history["ws"].name("ar")
    Registry(history["registry"].uri)  # points MLflow's process-wide registry URI at the temp store
    local = mlflow.artifacts.download_artifacts(f"models:/{name}@{CHAMPION}", dst_path=str(tmp_path))
    loaded = AutoModelForCausalLM.from_pretrained(local)
    expected = history["models"]["better"].state_dict()
    assert loaded.state_dict().keys() == expected.keys()
    assert all(torch.equal(loaded.state_dict()[key], value) for key, value in expected.items())
    assert history["registry"].alias_version(name, PREVIOUS_CHAMPION).version == 1


def test_forced_promotion_via_cli_records_reason(tmp_path_factory, store, tokenizer_dir, capsys):
    ws = make_workspace(tmp_path_factory, store, tokenizer_dir, "forced")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ws.root)
        ws.write_ar_checkpoint(seed=7)
        ws.write_training("ar")
        ws.write_eval({"ar": drafter_eval(1.0, 1.0)})  # below the floors
        assert not ws.promote()["drafters"]["ar"]["promoted"]
        params = ["--params", str(ws.params)]
        # through the gate by hand: still rejected; --force without a reason is refused
        assert registry_cmd.main(params + ["promote", "ar", "1"]) == 0
        assert registry_cmd.main(params + ["promote", "ar", "1", "--force"]) == 1
        registry = Registry(store)
        assert registry.alias_version(ws.name("ar"), CHAMPION) is None
        assert registry_cmd.main(["promote", "ar", "1", "--force", "--reason", "canary ok in prod"] + params) == 0
        version = registry.alias_version(ws.name("ar"), CHAMPION)
        assert version.version == 1 and version.tags["gate"] == "forced"
        assert version.tags["gate.forced_reason"] == "canary ok in prod" and version.tags["gate.forced_by"]
        assert registry_cmd.main(params + ["promote", "ar", "1"]) == 0  # already champion: not re-gated
        assert registry.version(ws.name("ar"), "1").tags["gate"] == "forced"
        capsys.readouterr()
        assert registry_cmd.main(params + ["list"]) == 0
        assert registry_cmd.main(params + ["show", ws.name("ar")]) == 0
        shown = capsys.readouterr().out  # data: stdout
        assert ws.name("ar") in shown and "forced" in shown


def test_stale_or_missing_inputs_fail_cleanly(tmp_path_factory, store, tokenizer_dir, capsys):
    ws = make_workspace(tmp_path_factory, store, tokenizer_dir, "stale")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ws.root)
        assert promote.main(["--params", str(ws.params)]) == 1
        assert "eval.json not found" in capsys.readouterr().err
        ws.write_ar_checkpoint(seed=0)
        ws.write_training("ar", verifier_hash="some-other-verifier")
        ws.write_eval({"ar": drafter_eval(2.0, 2.0)})
        assert promote.main(["--params", str(ws.params)]) == 1
        assert "trained against verifier some-other-verifier" in capsys.readouterr().err
        assert not (ws.root / "metrics/promotion.json").exists()


def _failed_promotion(ws: Workspace, capsys) -> str:
    """Promote in the workspace, expect exit 1, return stderr (only this run's)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ws.root)
        capsys.readouterr()
        assert promote.main(["--params", str(ws.params)]) == 1
    return capsys.readouterr().err.strip()


def _promote_in_subprocess(root: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pipeline.promote.promote", "--params", "params.yaml"], cwd=root,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_concurrent_promotions_register_one_version(tmp_path, tokenizer_dir):
    """Two real processes promote the same evaluation at once: one version, aliases intact."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (tmp_path / "ws").mkdir()
    ws = ready_workspace(tmp_path / "ws", store, "race", tokenizer_dir)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ws.root)
        ws.promote()  # v1 becomes champion; the race below is about its successor
    ws.write_ar_checkpoint(seed=2)
    ws.write_eval({"ar": drafter_eval(2.5, 2.5)})
    first, second = _promote_in_subprocess(ws.root), _promote_in_subprocess(ws.root)
    for process in (first, second):
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
    registry = Registry(store)
    versions = registry.versions(ws.name("ar"))
    assert [v.version for v in versions] == [1, 2]
    assert registry.alias_version(ws.name("ar"), CHAMPION).version == 2
    assert registry.alias_version(ws.name("ar"), PREVIOUS_CHAMPION).version == 1


def test_new_verifier_says_the_old_champion_is_not_comparable(tmp_path, tokenizer_dir, capsys):
    """A drafter for another verifier starts its own registered model; promote names the old champion
    in one line instead of comparing against it. Library versions are tagged on the version."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    old = ready_workspace(tmp_path / "old", store, "verifier-aaaa", tokenizer_dir, seed=1)
    new = ready_workspace(tmp_path / "new", store, "verifier-bbbb", tokenizer_dir, seed=2)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(old.root)
        assert old.promote()["drafters"]["ar"]["other_verifier_champion"] is None
        capsys.readouterr()
        patch.chdir(new.root)
        record = new.promote()["drafters"]["ar"]
    assert record["model_name"] == new.name("ar") and record["promoted"] and record["version"] == "1"
    assert record["other_verifier_champion"] == f"models:/{old.name('ar')}@champion (v1)"
    lines = [line for line in capsys.readouterr().err.splitlines() if "not comparable" in line]
    assert len(lines) == 1 and f"{old.name('ar')}@champion" in lines[0] and new.name("ar") in lines[0]
    tags = Registry(store).version(new.name("ar"), "1").tags
    assert tags["library.torch"] == torch.__version__ and tags["library.transformers"]


@pytest.mark.parametrize("content, expected", [
    (b"", "is empty (0 bytes)"),
    (b"this is not a database" * 100, "is not an SQLite database"),
])
def test_empty_or_foreign_store_is_refused_with_one_line(tmp_path, tokenizer_dir, capsys, content, expected):
    (tmp_path / "mlflow.db").write_bytes(content)
    ws = ready_workspace(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}", "corrupt", tokenizer_dir)
    err = _failed_promotion(ws, capsys)
    assert expected in err and "mlflow.db" in err and "\n" not in err
    assert (tmp_path / "mlflow.db").read_bytes() == content  # never replaced by a new registry
    assert not (tmp_path / "metrics/promotion.json").exists()


def test_damaged_sqlite_store_is_one_line(tmp_path, tokenizer_dir, capsys):
    database = tmp_path / "mlflow.db"
    Registry(f"sqlite:///{database}").experiment_id("x")  # a real store...
    data = bytearray(database.read_bytes())
    data[100:] = b"\xff" * (len(data) - 100)  # ...with every page after the header destroyed
    database.write_bytes(bytes(data))
    err = _failed_promotion(ready_workspace(tmp_path, f"sqlite:///{database}", "damaged", tokenizer_dir), capsys)
    assert "mlflow.db" in err and "Traceback" not in err and "\n" not in err


def test_dead_tracking_server_fails_fast(tmp_path, tokenizer_dir, capsys):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ws = ready_workspace(tmp_path, f"http://127.0.0.1:{port}", "dead", tokenizer_dir)
    started = time.monotonic()
    err = _failed_promotion(ws, capsys)
    assert time.monotonic() - started < 30
    assert f"127.0.0.1:{port} is not reachable" in err and "\n" not in err


def test_moved_project_is_refused_instead_of_writing_into_the_old_place(tmp_path, tokenizer_dir, capsys):
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    ws = ready_workspace(old, f"sqlite:///{old / 'mlflow.db'}", "moved", tokenizer_dir)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(old)
        ws.promote()
    shutil.copytree(old, new)
    err = _failed_promotion(ready_workspace(new, f"sqlite:///{new / 'mlflow.db'}", "moved", tokenizer_dir, 2, 2.5),
                            capsys)
    assert "keeps artifacts in" in err and str(old / "mlruns") in err and "\n" not in err


def test_experiment_created_by_training_is_not_taken_for_a_moved_project(tmp_path, tokenizer_dir):
    """Lightning's MLflow logger creates the experiment with artifacts under mlruns/<id> next to the DB."""
    from mlflow import MlflowClient

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    Registry(store)  # migrate the store
    MlflowClient(store).create_experiment(EXPERIMENT, artifact_location=str(tmp_path / "mlruns" / "1"))
    ws = ready_workspace(tmp_path, store, "trained-first", tokenizer_dir)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        assert ws.promote()["drafters"]["ar"]["promoted"]


def _promoted(ws: Workspace) -> dict:
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ws.root)
        return ws.promote()["drafters"]["ar"]


def test_metrics_of_other_artifacts_are_refused(tmp_path, tokenizer_dir, capsys):
    """A drafter retrained after evaluate, an export of another drafter, a changed verifier: refused."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ws = ready_workspace(tmp_path, store, "bound", tokenizer_dir)
    ws.write_training("ar", verifier_hash=ws.verifier_hash)  # retrained: training.json rewritten
    (ws.root / "artifacts/drafters/ar/model.safetensors").write_bytes(b"retrained")
    ar = _promoted(ws)
    assert ar["decision"] == "refused" and "drafter_identity" in ar["reasons"][0] and "rerun" in ar["reasons"][0]
    assert "REFUSED" in capsys.readouterr().err
    assert Registry(store).models() == []

    ws.write_eval({"ar": drafter_eval(2.0, 2.0)})  # evaluated again, but the export is older
    manifest = ws.root / "artifacts/export/ar/manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "lineage": {"drafter_hash": "0" * 64}}))
    # the edited manifest has a new hash: record it, as an evaluation of this export would
    evaluation = json.loads((ws.root / "metrics/eval.json").read_text())
    evaluation["drafters"]["ar"].update(ws.measured("ar"))
    (ws.root / "metrics/eval.json").write_text(json.dumps(evaluation))
    assert "was exported from drafter 000000000000" in _promoted(ws)["reasons"][0]

    ws.write_eval({"ar": drafter_eval(2.0, 2.0)})
    verifier_dir = ws.root / "artifacts/verifier"
    (verifier_dir / "config.json").write_text(json.dumps({"model_type": "qwen3", "test_verifier": "replaced"}))
    new = write_record(verifier_dir, source="bootstrap", name_or_path=str(verifier_dir), id_prefix="bound")
    assert f"verifier is now {new['hash'][:12]}" in _promoted(ws)["reasons"][0]

    # eval.json names the registered model (through the verifier id): it must be the current verifier's
    ws.verifier_id, ws.verifier_hash = "bound-000000000000", new["hash"]
    ws.write_eval({"ar": drafter_eval(2.0, 2.0)})
    assert f"names verifier bound-000000000000, the verifier is {new['id']}" in _promoted(ws)["reasons"][0]
    assert Registry(store).models() == []


def test_tau_is_bounded_by_the_drafters_own_drafts_per_step(tmp_path, tokenizer_dir):
    ws = ready_workspace(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}", "bounded", tokenizer_dir)
    (ws.root / "artifacts/export/ar/vllm.json").write_text(json.dumps(
        {"model": "/v", "speculative_config": {"method": "draft_model", "num_speculative_tokens": 4}}))
    ws.write_eval({"ar": drafter_eval(20.0, 2.0)})  # k=4 commits at most 5 tokens per verifier forward
    ar = _promoted(ws)
    assert not ar["promoted"] and any("outside the possible range [1, 5]" in r for r in ar["reasons"])


def test_one_checkpoint_is_one_version(tmp_path, tokenizer_dir):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ws = ready_workspace(tmp_path, store, "once", tokenizer_dir, tau=2.0)
    first = _promoted(ws)
    for tau in (1.5, 3.0):  # the same checkpoint evaluated again with other numbers
        ws.write_eval({"ar": drafter_eval(tau, tau)})
        again = _promoted(ws)
        assert again["already_registered"] and again["version"] == first["version"] == "1"
    assert len(Registry(store).versions(ws.name("ar"))) == 1


def test_manual_promote_without_force_never_rewrites_a_recorded_decision(tmp_path, tokenizer_dir, capsys,
                                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ws = ready_workspace(tmp_path, store, "manual", tokenizer_dir, tau=1.0)  # below the floors: rejected
    assert not _promoted(ws)["promoted"]
    params = yaml.safe_load(ws.params.read_text())
    params["promote"]["gates"] = {"code": {"min_tau": 1.0, "min_speedup": 1.0}}  # it would pass now
    ws.params.write_text(yaml.safe_dump(params))
    registry = Registry(store)
    decision = registry.version(ws.name("ar"), "1").tags["gate.decision"]
    capsys.readouterr()
    assert registry_cmd.main(["--params", str(ws.params), "promote", "ar", "1", "--reason", "x"]) == 0
    assert "already decided 'rejected'" in capsys.readouterr().err
    version = registry.version(ws.name("ar"), "1")
    assert version.tags["gate"] == "rejected" and version.tags["gate.decision"] == decision
    assert registry.alias_version(ws.name("ar"), CHAMPION) is None


# ------------------------------------------------------------------ what the registry owns; new evidence re-gates

def _lossy_eval(tau: float) -> dict:
    return {**drafter_eval(tau, tau), "lossless": False, "mismatches": 5}


def _two_versions(tmp_path: Path, tokenizer_dir: Path, label: str) -> tuple[Workspace, str]:
    """v1 then a better v2: v2 champion, v1 previous_champion."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ws = ready_workspace(tmp_path, store, label, tokenizer_dir, seed=1, tau=2.0)
    assert _promoted(ws)["promoted"]
    ws.write_ar_checkpoint(seed=2)
    ws.write_eval({"ar": drafter_eval(2.5, 2.5)})
    assert _promoted(ws)["champion_version"] == "2"
    return ws, store


def test_foreign_registered_model_is_refused_unless_adopted(tmp_path, tokenizer_dir, capsys, monkeypatch):
    """A model of the same name registered by someone else (no draftline tags, aliased `champion`)."""
    from mlflow import MlflowClient

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ws = ready_workspace(tmp_path, store, "foreign", tokenizer_dir)
    Registry(store)  # migrate the store
    client = MlflowClient(store, registry_uri=store)
    client.create_registered_model(ws.name("ar"))
    client.create_model_version(ws.name("ar"), source=str(tmp_path))
    client.set_registered_model_alias(ws.name("ar"), CHAMPION, "1")
    err = _failed_promotion(ws, capsys)
    assert "was not created by draftline" in err and "--adopt-foreign-model" in err and "\n" not in err
    assert len(Registry(store).versions(ws.name("ar"))) == 1
    monkeypatch.chdir(tmp_path)  # registry promote of its version is refused the same way
    assert registry_cmd.main(["--params", str(ws.params), "promote", "ar", "1", "--force", "--reason", "x"]) == 1
    assert "was not created by draftline" in capsys.readouterr().err
    assert promote.main(["--params", str(ws.params), "--adopt-foreign-model"]) == 0
    assert len(Registry(store).versions(ws.name("ar"))) == 2
    assert ws.promote()["drafters"]["ar"]["already_registered"]  # adopted: no flag needed any more


@pytest.mark.parametrize("typed", ["00001", "1.0", "+1", "01", "one"])
def test_version_arguments_are_exact_integers(tmp_path, tokenizer_dir, capsys, monkeypatch, typed):
    ws, store = _two_versions(tmp_path, tokenizer_dir, "exact")
    monkeypatch.chdir(tmp_path)
    params = ["--params", str(ws.params)]
    assert registry_cmd.main(params + ["promote", "ar", "1", "--force", "--reason", "rollback"]) == 0
    capsys.readouterr()
    assert registry_cmd.main(params + ["promote", "ar", typed, "--force", "--reason", "again"]) == 1
    err = capsys.readouterr().err.strip()
    assert f"got '{typed}'" in err and "\n" not in err
    assert registry_cmd.main(params + ["show", "ar", typed]) == 1
    registry = Registry(store)
    assert registry.alias_version(ws.name("ar"), CHAMPION).version == 1
    assert registry.alias_version(ws.name("ar"), PREVIOUS_CHAMPION).version == 2  # the rollback alias kept


def test_forcing_the_champion_again_keeps_the_rollback_alias(tmp_path, tokenizer_dir, monkeypatch):
    ws, store = _two_versions(tmp_path, tokenizer_dir, "twice")
    monkeypatch.chdir(tmp_path)
    registry = Registry(store)
    for _ in range(2):
        assert registry_cmd.main(["--params", str(ws.params), "promote", "ar", "1", "--force", "--reason", "r"]) == 0
    assert registry.alias_version(ws.name("ar"), CHAMPION).version == 1
    assert registry.alias_version(ws.name("ar"), PREVIOUS_CHAMPION).version == 2
    registry.set_champion(ws.name("ar"), "2")  # roll back to 2: the aliases swap, never coincide
    assert registry.alias_version(ws.name("ar"), PREVIOUS_CHAMPION).version == 1


def test_registry_list_prints_full_names_to_stdout_when_it_is_not_a_terminal(tmp_path, tokenizer_dir, capsys, monkeypatch):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ws = ready_workspace(tmp_path, store, "a-verifier-with-a-long-name", tokenizer_dir)
    params = yaml.safe_load(ws.params.read_text())
    params["promote"]["model_name_prefix"] = "team-speculative-decoding-drafters"
    ws.params.write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    registry = Registry(store)
    names = [f"team-speculative-decoding-drafters-{ws.verifier_id}-{kind}" for kind in ("ar", "block", "eagle3")]
    for name in names:
        registry.client.create_registered_model(name, tags={"draftline.owner": "draftline"})
    capsys.readouterr()
    assert registry_cmd.main(["--params", str(ws.params), "list"]) == 0
    listed = capsys.readouterr()
    # `draftline registry list | grep block` got nothing when the table went to stderr
    assert all(name in listed.out for name in names), listed.out
    grepped = [line for line in listed.out.splitlines() if "block" in line]
    assert len(grepped) == 1 and names[1] in grepped[0] and names[1] not in listed.err


def test_new_evidence_regates_and_demotes_the_champion(tmp_path, tokenizer_dir, capsys):
    """The champion's checkpoint evaluated again: eval.json now reports 5 mismatches."""
    ws, store = _two_versions(tmp_path, tokenizer_dir, "evidence")
    ws.write_eval({"ar": _lossy_eval(2.5)})
    capsys.readouterr()
    ar = _promoted(ws)
    out = " ".join(capsys.readouterr().err.split())  # rich wraps lines at 80 columns
    assert ar["version"] == "2" and ar["regated"] and not ar["promoted"] and ar["decision"] == "rejected"
    assert "new evaluation/serving evidence" in ar["regated_because"] and "no change" not in out
    assert "mismatches 5" in out and "lost champion" in out and "v1 is champion again" in out
    registry = Registry(store)
    assert registry.alias_version(ws.name("ar"), CHAMPION).version == 1
    assert registry.alias_version(ws.name("ar"), PREVIOUS_CHAMPION) is None
    tags = registry.version(ws.name("ar"), "2").tags
    assert tags["gate"] == "rejected" and "mismatches 5" in tags["gate.demoted_reason"]
    assert tags["metric.mismatches"] == "5.0"
    again = _promoted(ws)  # the same evidence again: the decision stands
    assert again["already_registered"] and not again["regated"] and len(registry.versions(ws.name("ar"))) == 2


def test_changed_serving_evidence_regates(tmp_path, tokenizer_dir):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ws = ready_workspace(tmp_path, store, "served", tokenizer_dir)
    assert _promoted(ws)["promoted"]
    (ws.root / "metrics/serving.json").write_text(json.dumps({"concurrency": 8, "drafters": {"ar": {"domains": {
        "code": {"batched": {"vllm": {"tau": 1.9}}, "single": {"vllm": {"tau": 1.9}}, "draftline": {"tau": 2.0}}}}}}))
    ar = _promoted(ws)
    assert ar["regated"] and ar["promoted"] and ar["version"] == "1"
    assert Registry(store).version(ws.name("ar"), "1").tags["serve_check.code.served_tau"] == "1.9"


def test_champion_refused_by_a_new_serve_check_loses_champion(tmp_path, tokenizer_dir, capsys):
    ws, store = _two_versions(tmp_path, tokenizer_dir, "unserved")
    params = yaml.safe_load(ws.params.read_text())
    params["serve_check"]["required"] = True
    ws.params.write_text(yaml.safe_dump(params))
    (ws.root / "metrics/serving.json").write_text(json.dumps({"verifier_hash": ws.verifier_hash, "drafters": {
        "ar": {**ws.measured("ar"), "status": "failed", "reason": "vLLM's outputs differ from the verifier's"}}}))
    capsys.readouterr()
    ar = _promoted(ws)
    assert ar["decision"] == "refused" and "lost champion" in ar["demoted"] and "v1 is champion again" in ar["demoted"]
    assert "lost champion" in " ".join(capsys.readouterr().err.split())
    assert Registry(store).alias_version(ws.name("ar"), CHAMPION).version == 1


def test_noisy_speed_is_undecided_not_registered_as_rejected(tmp_path, tokenizer_dir, capsys):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ws = ready_workspace(tmp_path, store, "noisy", tokenizer_dir)
    entry = drafter_eval(2.0, 2.0, speedup=0.95)  # below the floor 1.0, inside a 60% spread
    for domain in entry["by_temperature"]["0.0"].values():
        domain.update(speedup_noisy=True, speedup_spread=0.6)
    ws.write_eval({"ar": entry})
    capsys.readouterr()
    ar = _promoted(ws)
    out = " ".join(capsys.readouterr().err.split())
    assert not ar["promoted"] and ar["decision"] == "undecided" and ar["reasons"] == [] and ar["undecided"]
    assert "UNDECIDED" in out and "quiet machine" in out and "REJECTED" not in out
    assert Registry(store).version(ws.name("ar"), "1").tags["gate"] == "undecided"
    assert Registry(store).alias_version(ws.name("ar"), CHAMPION) is None


# ------------------------------------------------------------------ the gate decides at every serving temperature

def _set_gate_temperatures(ws: Workspace, temperatures: list[float] | None) -> None:
    params = yaml.safe_load(ws.params.read_text())
    params["promote"].pop("temperatures", None)
    if temperatures is not None:
        params["promote"]["temperatures"] = temperatures
    ws.params.write_text(yaml.safe_dump(params))


def test_a_drafter_slower_when_sampling_is_rejected_at_that_temperature(tmp_path, tokenizer_dir, capsys, monkeypatch):
    """The demo's block drafter paid at T=0 and cost 11% at T=0.8, and the gate (T=0 only) promoted it.
    Rejected now, per temperature and domain everywhere the verdict is recorded; a greedy-only gate promotes
    it, and changing the list back re-gates it (and it loses the alias it won under the greedy-only gate)."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ws = ready_workspace(tmp_path, store, "sampled", tokenizer_dir)
    monkeypatch.chdir(ws.root)  # `registry show ar` finds the verifier in metrics/eval.json
    sampled = {"code": domain_metrics(1.83, 0.89), "text": domain_metrics(1.79, 1.1)}
    ws.write_eval({"ar": drafter_eval(3.38, 4.11, 1.66, sampled=sampled)})
    capsys.readouterr()
    ar = _promoted(ws)
    assert ar["decision"] == "rejected" and ar["reasons"] == ["T=0.8 code speedup 0.89 < floor 1"]
    assert ar["verdicts"] == {"0.0": {"code": "passed", "text": "passed"}, "0.8": {"code": "rejected", "text": "passed"}}
    printed = " ".join(capsys.readouterr().err.split())
    assert "REJECTED" in printed and "T=0.8 code speedup 0.89 < floor 1" in printed and "T=0.8" in printed
    registry = Registry(store)
    version = registry.version(ws.name("ar"), "1")
    assert version.tags["gate.verdict.T0.8/code"] == "rejected" and version.tags["gate.verdict.T0.0/code"] == "passed"
    assert "T=0.0, 0.8" in version.description
    assert registry.client.get_run(version.run_id).data.tags["gate.verdict.T0.8/code"] == "rejected"
    assert json.loads((ws.root / "metrics/promotion.json").read_text())["drafters"]["ar"]["verdicts"] == ar["verdicts"]

    _set_gate_temperatures(ws, [0.0])  # a deployment that serves greedy only
    greedy = _promoted(ws)
    assert greedy["promoted"] and greedy["regated"] and greedy["version"] == "1"
    assert greedy["regated_because"] == "promote thresholds or temperatures changed"
    assert greedy["verdicts"] == {"0.0": {"code": "passed", "text": "passed"}}
    tags = registry.version(ws.name("ar"), "1").tags
    assert "gate.verdict.T0.8/code" not in tags  # no verdict of the earlier gate is left behind
    assert "gate.verdict.T0.8/code" not in registry.client.get_run(version.run_id).data.tags
    capsys.readouterr()
    assert registry_cmd.main(["--params", str(ws.params), "list"]) == 0
    listed = capsys.readouterr().out
    assert "latest at T=0.0" in listed and "T=0.8" not in listed

    _set_gate_temperatures(ws, None)  # back to every evaluated temperature
    regated = _promoted(ws)
    assert regated["regated"] and regated["decision"] == "rejected" and "lost champion" in regated["demoted"]
    assert registry.alias_version(ws.name("ar"), CHAMPION) is None
    capsys.readouterr()
    assert registry_cmd.main(["--params", str(ws.params), "list"]) == 0
    assert registry_cmd.main(["--params", str(ws.params), "show", "ar"]) == 0
    shown = capsys.readouterr().out
    assert "latest at T=0.8" in shown and "rejected: code" in shown and "T=0.8 rejected: code" in shown
