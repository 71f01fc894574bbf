"""Artifacts the pipeline did not write in this run are untrusted: no foreign code runs, no pickles load."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from data_prep.verifier import write_record
from pipeline.errors import DraftlineError
from tests.test_spec_loops import block_model
from tests.tiny_models import save_tiny_verifier, tiny_qwen3

ROOT = Path(__file__).resolve().parents[1]
EVIL = """
from pathlib import Path
Path({marker!r}).write_text("foreign code ran")
from transformers import PretrainedConfig, PreTrainedModel
class EvilConfig(PretrainedConfig):
    model_type = "evil_arch"
class EvilModel(PreTrainedModel):
    config_class = EvilConfig
"""


def plant_evil(directory: Path, marker: Path) -> None:
    """`config.json` names an unknown model type whose code `evil.py`, in the same directory, provides."""
    (directory / "evil.py").write_text(EVIL.format(marker=str(marker)))
    config = json.loads((directory / "config.json").read_text())
    config.update(model_type="evil_arch", architectures=["EvilModel"],
                  auto_map={"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"})
    (directory / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A verifier, and an AR drafter directory with `evil.py` planted in it."""
    root = tmp_path_factory.mktemp("trust_project")
    artifacts = root / "artifacts"
    verifier, tokenizer = save_tiny_verifier(artifacts / "verifier")
    write_record(artifacts / "verifier", source="bootstrap", name_or_path=str(artifacts / "verifier"), id_prefix="t")
    drafter_dir = artifacts / "drafters" / "ar"
    tiny_qwen3(len(tokenizer), num_layers=1, seed=5, eos_token_id=tokenizer.eos_token_id).save_pretrained(drafter_dir)
    tokenizer.save_pretrained(drafter_dir)
    plant_evil(drafter_dir, root / "MARKER")
    (root / "params.yaml").write_text(json.dumps({"evaluate": {"drafters": ["ar"]}}))
    return root


def child_env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}


def test_planted_code_never_runs_through_the_drafter_loaders(project):
    from pipeline.drafters.ar.model import load_drafter
    from pipeline.integrity import load_tokenizer

    drafter_dir = project / "artifacts" / "drafters" / "ar"
    with pytest.raises(DraftlineError, match="auto_map"):
        load_drafter(drafter_dir)
    with pytest.raises(DraftlineError, match="auto_map"):
        load_tokenizer(drafter_dir, "drafter", "retrain it")
    assert not (project / "MARKER").exists()


def test_planted_code_never_runs_from_the_cli_even_when_stdin_answers_yes(project):
    """transformers asks "Do you wish to run the custom code?" when the flag is left unset."""
    done = subprocess.run([sys.executable, "-m", "serve_eval.generate", "--params", "params.yaml", "--prompt", "x",
                           "--drafter", "ar", "--max-new-tokens", "2"], cwd=project, env=child_env(),
                          input="y\ny\ny\n", capture_output=True, text=True, timeout=300)
    assert not (project / "MARKER").exists(), done.stderr[-2000:]
    assert done.returncode != 0
    err = done.stderr.strip()
    assert err.startswith("draftline: error: ") and "\n" not in err and "auto_map" in err, err[-2000:]


def test_pickled_weights_beside_a_decoy_safetensors_are_refused(tmp_path):
    from pipeline.drafters.ar.model import load_drafter
    from pipeline.drafters.block.model import load_drafter as load_block_drafter
    from pipeline.integrity import safetensors_shapes

    model = tiny_qwen3(64, num_layers=1)
    model.config.save_pretrained(tmp_path / "ar")
    torch.save(model.state_dict(), tmp_path / "ar" / "pytorch_model.bin")
    save_file({"decoy": torch.zeros(1)}, str(tmp_path / "ar" / "decoy.safetensors"))
    for load in (load_drafter, lambda path: safetensors_shapes(path, "fix")):
        with pytest.raises(DraftlineError, match=r"pickled weights \(pytorch_model.bin\)"):
            load(tmp_path / "ar")

    block = block_model(tiny_qwen3(64, num_layers=2), 4)
    block.save_pretrained(tmp_path / "block")
    torch.save({}, tmp_path / "block" / "extra.pt")
    with pytest.raises(DraftlineError, match="extra.pt"):
        load_block_drafter(tmp_path / "block")


def test_verifier_with_auto_map_is_refused_unless_params_trust_it(project, tmp_path):
    from data_prep.verifier import load_model_and_tokenizer

    verifier_dir = tmp_path / "verifier"
    save_tiny_verifier(verifier_dir)
    plant_evil(verifier_dir, tmp_path / "MARKER")
    with pytest.raises(DraftlineError, match="trust_remote_code is off"):
        load_model_and_tokenizer(str(verifier_dir))
    assert not (tmp_path / "MARKER").exists()


# --------------------------------------------------------------------------- MLflow stores, every entry point


def _train(tmp_path, uri: str) -> int:
    from train.dispatch import main as train_main

    (tmp_path / "params.yaml").write_text(json.dumps({"tracking": {"uri": uri},
                                                      "project": {"artifacts_dir": str(tmp_path / "artifacts")}}))
    return train_main(["--params", str(tmp_path / "params.yaml"), "--drafter", "ar"])


def test_train_refuses_an_empty_store_instead_of_recreating_it(tmp_path, capsys):
    database = tmp_path / "mlflow.db"
    database.write_bytes(b"")
    assert _train(tmp_path, f"sqlite:///{database}") == 1
    err = capsys.readouterr().err.strip()
    assert "is empty (0 bytes)" in err and "\n" not in err
    assert database.read_bytes() == b""


def test_train_fails_fast_on_an_unreachable_tracking_server(tmp_path, capsys):
    import socket
    import time

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.monotonic()
    assert _train(tmp_path, f"http://user:s3cret@127.0.0.1:{port}") == 1
    err = capsys.readouterr().err
    assert time.monotonic() - started < 30 and "is not reachable" in err
    assert "s3cret" not in err  # credentials in a URL are never echoed


def test_a_foreign_sqlite_file_is_refused_and_left_untouched(tmp_path):
    import sqlite3

    from pipeline.promote.model_registry import Registry

    database = tmp_path / "mlflow.db"
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE invoices (id INTEGER)")
    before = database.read_bytes()
    with pytest.raises(DraftlineError, match="SQLite database of something else .tables: invoices"):
        Registry(f"sqlite:///{database}")
    assert database.read_bytes() == before


def test_a_locked_store_is_reported_as_transient_never_as_one_to_discard(tmp_path, monkeypatch):
    import sqlite3

    from pipeline import tracking
    from pipeline.promote.model_registry import Registry

    database = tmp_path / "mlflow.db"
    Registry(f"sqlite:///{database}")  # a real MLflow store
    monkeypatch.setattr(tracking, "SQLITE_BUSY_TIMEOUT_S", 0.2)
    holder = sqlite3.connect(database, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(DraftlineError) as error:
            tracking.check_store(f"sqlite:///{database}")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert "locked" in str(error.value) and "intact" in str(error.value)
    assert "new, empty registry" not in str(error.value) and "move it away" not in str(error.value)


# --------------------------------------------------------------------------- dvc repro keeps the last results


@pytest.mark.parametrize("name", ["evaluate", "serve_check"])
def test_a_failing_stage_under_dvc_repro_keeps_the_previous_metrics_and_plots(tmp_path, name):
    """DVC deletes a stage's declared outputs before running it; these are uncached, so without
    `persist` a failed run would lose the last results for good. Runs real DVC on the stage's own outs."""
    import shutil

    import yaml

    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"][name]
    stage = {"cmd": f"python -c \"raise SystemExit('{name} failed')\"", "metrics": stage["metrics"],
             "plots": stage["plots"]}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {name: stage}}))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"project": {"metrics_dir": "metrics", "plots_dir": "plots"}}))
    outputs = [next(iter(entry)).replace("${project.metrics_dir}", "metrics").replace("${project.plots_dir}", "plots")
               for entry in stage["metrics"] + stage["plots"]]
    for relative in outputs:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(f"previous {relative}")
    dvc = shutil.which("dvc", path=str(Path(sys.executable).parent)) or "dvc"
    env = {**child_env(), "DVC_NO_ANALYTICS": "1"}
    subprocess.run([dvc, "init", "--no-scm", "-q"], cwd=tmp_path, env=env, check=True, timeout=120)
    done = subprocess.run([dvc, "repro", name], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0 and f"{name} failed" in done.stdout + done.stderr
    for relative in outputs:
        assert (tmp_path / relative).read_text() == f"previous {relative}"


# --------------------------------------------------------------------------- paths


@pytest.mark.parametrize("key", ["artifacts_dir", "metrics_dir", "plots_dir"])
def test_relative_output_dirs_leaving_the_project_are_refused(tmp_path, key):
    path = tmp_path / "params.yaml"
    path.write_text(json.dumps({"project": {key: "run/../../../.."}}))
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "params", "check", "--params", str(path)],
                          cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert f"project: {key} 'run/../../../..' leaves the project directory" in done.stderr

    from pipeline.config.schema import parse_all

    assert parse_all({"project": {key: "../elsewhere", "allow_outside": True}})  # said explicitly: allowed
    assert parse_all({"project": {key: "run/../inside"}})
