"""Artifacts the pipeline did not write in this run are untrusted: no foreign code runs, no pickles load."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file

from pipeline.errors import DraftlineError
from pipeline.verifier_record import write_record
from tests.support.decoding import block_model
from tests.support.tiny_models import save_tiny_verifier, tiny_qwen3, tiny_tokenizer

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
        load_block_drafter(tmp_path / "block", "block")


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


def test_a_store_whose_writer_was_killed_mid_transaction_is_recovered_not_refused(tmp_path):
    """A SIGKILLed training run can leave a hot journal beside mlflow.db; the resumed run must roll it back
    (as any SQLite writer does), not call the store unreadable."""
    import sqlite3

    from pipeline import tracking
    from pipeline.promote.model_registry import Registry

    database = tmp_path / "mlflow.db"
    Registry(f"sqlite:///{database}").experiment_id("kept")
    writer = subprocess.run([sys.executable, "-c", (
        "import os, sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('PRAGMA cache_size=1'); c.execute('BEGIN')\n"  # a tiny cache spills pages into the file
        "c.execute('CREATE TABLE half_written (x BLOB)')\n"
        "c.executemany('INSERT INTO half_written VALUES (?)', [(b'x' * 500,)] * 2000)\n"
        "os.kill(os.getpid(), 9)\n"), str(database)])
    assert writer.returncode == -9 and Path(f"{database}-journal").exists()

    tracking.check_store(f"sqlite:///{database}")
    assert not Path(f"{database}-journal").exists()  # rolled back: the half-written table is gone
    with sqlite3.connect(database) as connection:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "half_written" not in tables and tracking.MLFLOW_TABLES <= tables
    assert Registry(f"sqlite:///{database}").experiment_id("kept")


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


@pytest.mark.parametrize("text, key", [
    ('project: {artifacts_dir: "art\\0ifacts"}\n', "project.artifacts_dir"),
    ('corpus: {sources: [{kind: file, path: "p\\0.jsonl", domain: code}]}\n', "corpus.sources.0.path"),
])
def test_a_nul_byte_in_params_is_one_line_naming_the_key(tmp_path, text, key):
    """No path or name can hold NUL; the OS call that trips on it (realpath, open) would raise deep inside."""
    (tmp_path / "params.yaml").write_text(text)
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "params", "check", "--params", "params.yaml"],
                          cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr == f"draftline: error: params.yaml: {key}: contains a NUL byte; remove it\n"


def test_a_yaml_alias_bomb_is_one_short_line(tmp_path):
    """8 levels of 8 aliases: a value of 16.7M strings once expanded, whose repr in the message was 25 MB."""
    lines = ["corpus:", "  engine: openai", "  x0: &x0 [" + ", ".join(["http://a"] * 8) + "]"]
    lines += [f"  x{i}: &x{i} [" + ", ".join([f"*x{i - 1}"] * 8) + "]" for i in range(1, 7)]
    lines.append("  endpoints: [" + ", ".join(["*x6"] * 8) + "]")
    (tmp_path / "params.yaml").write_text("\n".join(lines) + "\n")
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "params", "check", "--params", "params.yaml"],
                          cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and len(done.stderr) < 1000, done.stderr[:2000]
    assert done.stderr.startswith("draftline: error: params.yaml: corpus.endpoints.0: Input should be a valid string")


# --------------------------------------------------------------------------- training checkpoints


class Planted:
    """Unpickled, it runs `exec`: what a hostile checkpoint would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('pickle ran')",)


def plant_checkpoint(path: Path, marker: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"global_step": 5, "state_dict": {}, "payload": Planted(marker)}, path)


@pytest.mark.parametrize("layout", ["lightning_file", "deepspeed_dir"])
def test_a_planted_training_checkpoint_is_refused_without_unpickling_it(tmp_path, layout):
    from train.trainer import FINGERPRINT_FILE, LAST_CHECKPOINT, resume_checkpoint

    fingerprint = {"train.ar": {"x": 1}}
    (tmp_path / FINGERPRINT_FILE).write_text(json.dumps(fingerprint))
    target = tmp_path / LAST_CHECKPOINT
    plant_checkpoint(target if layout == "lightning_file" else target / "checkpoint" / "mp_rank_00_model_states.pt",
                     tmp_path / "MARKER")
    torch.save({"global_step": 2}, tmp_path / "step000002.ckpt")  # an intact older one is not a way around it
    with pytest.raises(DraftlineError) as error:
        resume_checkpoint(tmp_path, fingerprint)
    message = str(error.value)
    assert "builtins.exec" in message and f"delete {tmp_path} to train from the start" in message
    assert "\n" not in message
    assert not (tmp_path / "MARKER").exists()
    assert target.exists()  # deleting it is the user's decision


def test_an_unreadable_fingerprint_discards_the_checkpoints_instead_of_a_traceback(tmp_path, capsys):
    from train.trainer import FINGERPRINT_FILE, LAST_CHECKPOINT, resume_checkpoint

    (tmp_path / FINGERPRINT_FILE).write_text("{not json")
    torch.save({"global_step": 2}, tmp_path / LAST_CHECKPOINT)
    assert resume_checkpoint(tmp_path, {"train.ar": {"x": 1}}) is None
    assert "is unreadable; discarding the checkpoints" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / LAST_CHECKPOINT).exists()
    assert json.loads((tmp_path / FINGERPRINT_FILE).read_text()) == {"train.ar": {"x": 1}}


def test_objects_the_static_scan_misses_are_still_loaded_weights_only(tmp_path, monkeypatch):
    from train.trainer import FINGERPRINT_FILE, LAST_CHECKPOINT, resume_checkpoint

    fingerprint = {"train.ar": {"x": 1}}
    (tmp_path / FINGERPRINT_FILE).write_text(json.dumps(fingerprint))
    plant_checkpoint(tmp_path / LAST_CHECKPOINT, tmp_path / "MARKER")
    monkeypatch.setattr(torch.serialization, "get_unsafe_globals_in_checkpoint", lambda path: [])
    with pytest.raises(DraftlineError, match=r"training state \(exec\), which could run code"):
        resume_checkpoint(tmp_path, fingerprint)
    assert not (tmp_path / "MARKER").exists()


def test_deepspeed_shards_load_weights_only_with_exactly_its_own_classes_allowed(tmp_path):
    """DeepSpeed 0.19 loads its shards with weights_only=False; the strategy swaps in a weights-only load
    that still reads what ZeRO optimizer shards hold (stage enum, loss scalers, fragment addresses)."""
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    from train.strategies import WeightsOnlyLoads

    engine = WeightsOnlyLoads(TorchCheckpointEngine())
    shard = tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    torch.save({"optimizer_state_dict": {"zero_stage": ZeroStageEnum.gradients, "loss_scaler": LossScaler(1.0),
                                         "fp16_scaler": DynamicLossScaler(init_scale=2.0**16,
                                                                          scale_window=1000, min_scale=1.0,
                                                                          delayed_shift=1, consecutive_hysteresis=False,
                                                                          raise_error_at_min_scale=True,
                                                                          dtype=torch.float16),
                                         "address": fragment_address(numel=4, start=0)}}, shard)
    loaded = engine.load(str(shard), map_location="cpu")["optimizer_state_dict"]
    assert loaded["zero_stage"] == ZeroStageEnum.gradients and loaded["fp16_scaler"].cur_scale == 2.0**16

    plant_checkpoint(tmp_path / "mp_rank_00_model_states.pt", tmp_path / "MARKER")
    with pytest.raises(Exception, match="Weights only load failed"):
        engine.load(str(tmp_path / "mp_rank_00_model_states.pt"))
    assert not (tmp_path / "MARKER").exists()
    assert engine.commit == engine._engine.commit  # everything but load is DeepSpeed's own


def test_train_refuses_a_planted_checkpoint_in_one_line(tmp_path):
    """Through the real stage: the checkpoint dir matches the run's fingerprint, so resume would read it."""
    from data_prep.corpus import corpus_hash
    from pipeline.config.schema import load_all
    from pipeline.features.store import read_index
    from pipeline.paths import ArtifactPaths
    from pipeline.verifier_record import verifier_identity
    from tests.support.training import run_train, write_params
    from tests.support.workspace import make_artifacts
    from train.distill import checkpoint_fingerprint
    from train.trainer import FINGERPRINT_FILE, LAST_CHECKPOINT

    make_artifacts(tmp_path)
    params_path = write_params(tmp_path, {"max_steps": 2})
    params = load_all(params_path)
    paths = ArtifactPaths.from_params(params)
    checkpoints = paths.checkpoints("ar")
    checkpoints.mkdir(parents=True)
    (checkpoints / FINGERPRINT_FILE).write_text(json.dumps(checkpoint_fingerprint(
        "ar", params.train.ar, verifier_identity(paths)["hash"], corpus_hash(paths), params.project.seed,
        read_index(paths.features).content_hash())))
    plant_checkpoint(checkpoints / LAST_CHECKPOINT, tmp_path / "MARKER")
    done = run_train(params_path)
    assert done.returncode == 1, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("draftline: error: checkpoint ") and f"delete {checkpoints}" in last
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "MARKER").exists()
    assert not paths.drafter("ar").exists()


# --------------------------------------------------------------------------- verifier.allow_pickle_weights


def pickled_verifier(directory: Path, marker: Path | None = None) -> dict:
    """A tiny verifier whose weights are only a `pytorch_model.bin`; with `marker`, the pickle also holds an
    object that writes it when unpickled. Returns the state dict saved."""
    model, _ = save_tiny_verifier(directory)
    (directory / "model.safetensors").unlink()
    state = model.state_dict()
    torch.save({**state, "payload": Planted(marker)} if marker else state, directory / "pytorch_model.bin")
    return state


def record_verifier(tmp_path: Path, verifier_dir: Path, allow: bool) -> subprocess.CompletedProcess:
    """`draftline bootstrap_verifier` with an external verifier: it loads the model and records its hash."""
    (tmp_path / "params.yaml").write_text(json.dumps({"verifier": {
        "source": "hf", "name_or_path": str(verifier_dir), "allow_pickle_weights": allow}}))
    return subprocess.run([sys.executable, "-m", "pipeline.cli", "bootstrap_verifier", "--params", "params.yaml"],
                          cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=300)


def one_error_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("draftline: error: "), done.stderr[-3000:]
    return last


@pytest.mark.parametrize("allow", [False, True])
def test_a_planted_pickle_in_the_verifier_never_runs(tmp_path, allow):
    pickled_verifier(tmp_path / "model", tmp_path / "MARKER")
    last = one_error_line(record_verifier(tmp_path, tmp_path / "model", allow))
    if allow:  # unpickled weights-only: the object is refused, not built
        assert "hold objects that are not tensors (exec)" in last and "convert them to safetensors" in last
    else:  # never opened at all
        assert "holds pickled weights (pytorch_model.bin)" in last
    assert not (tmp_path / "MARKER").exists()
    assert not (tmp_path / "artifacts" / "verifier").exists()


def test_pickled_verifier_weights_load_weights_only_when_params_allow_them(tmp_path):
    from data_prep.verifier import load_model_and_tokenizer
    from pipeline.lineage import model_identity

    state = pickled_verifier(tmp_path / "model")
    with pytest.raises(DraftlineError, match="pickled weights"):
        load_model_and_tokenizer(str(tmp_path / "model"))
    model, _ = load_model_and_tokenizer(str(tmp_path / "model"), allow_pickle_weights=True)
    assert all(torch.equal(model.state_dict()[name], tensor) for name, tensor in state.items())

    done = record_verifier(tmp_path, tmp_path / "model", allow=True)
    assert done.returncode == 0, done.stderr[-3000:]
    recorded = json.loads((tmp_path / "artifacts" / "verifier" / "verifier.json").read_text())["hash"]
    assert recorded == model_identity(tmp_path / "model")
    # the identity covers the pickled weights' bytes: changed weights are another verifier
    state["lm_head.weight"] = state["lm_head.weight"] + 1
    torch.save(state, tmp_path / "model" / "pytorch_model.bin")
    assert model_identity(tmp_path / "model") != recorded


# --------------------------------------------------------------------------- the verifier's identity is recomputed


@pytest.mark.parametrize("tamper", ["weights", "recorded_hash", "recorded_id", "moved"])
def test_verifier_identity_is_the_files_not_what_verifier_json_says(tmp_path, tamper):
    from pipeline.paths import ArtifactPaths
    from pipeline.verifier_record import verifier_identity

    paths = ArtifactPaths(tmp_path / "artifacts", tmp_path / "metrics", tmp_path / "plots")
    model, _ = save_tiny_verifier(paths.verifier)
    record = write_record(paths.verifier, source="bootstrap", name_or_path=str(paths.verifier), id_prefix="t")
    assert verifier_identity(paths) == {"id": record["id"], "hash": record["hash"], "source": "bootstrap"}
    record_path = paths.verifier / "verifier.json"
    if tamper == "weights":  # swapped in place, verifier.json left as it was
        state = model.state_dict()
        save_file({**state, "lm_head.weight": state["lm_head.weight"] + 1}, str(paths.verifier / "model.safetensors"))
        expected = "is not the one .* recorded"
    elif tamper == "moved":
        record_path.write_text(json.dumps({**record, "source": "hf", "name_or_path": str(tmp_path / "gone")}))
        expected = r"is not at .*gone \(no config.json\); re-record it with `dvc repro -f bootstrap_verifier`"
    else:  # an id naming another verifier would register the drafter under that verifier's model
        key, value = ("hash", "0" * 64) if tamper == "recorded_hash" else ("id", "t-000000000000")
        record_path.write_text(json.dumps({**record, key: value}))
        expected = "is not the one .* recorded" if key == "hash" else "id 't-000000000000' is not one"
    with pytest.raises(DraftlineError, match=expected):
        verifier_identity(paths)


def test_promote_refuses_when_the_verifier_was_swapped_after_evaluate(tmp_path, capsys):
    """verifier.json still holds the old hash, and so does eval.json: only recomputing finds the swap."""
    from pipeline.promote import promote
    from pipeline.promote.model_registry import Registry
    from tests.support.promotion import ready_workspace

    tokenizer_dir = tmp_path / "tokenizer"
    tiny_tokenizer().save_pretrained(tokenizer_dir)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ws = ready_workspace(tmp_path, store, "swapped", tokenizer_dir)
    (ws.root / "artifacts/verifier/config.json").write_text(json.dumps({"model_type": "qwen3", "other": True}))
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ws.root)
        assert promote.main(["--params", str(ws.params)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.splitlines()[-1].startswith("draftline: error: the verifier at ") and "Traceback" not in err
    assert Registry(store).models() == []


# --------------------------------------------------------------------------- second probe: what it found


def test_a_verifier_record_pointing_at_the_filesystem_root_is_refused_without_walking_it(tmp_path):
    """Recomputing the identity hashes the directory the record names: never a tree that is not a model."""
    from pipeline.paths import ArtifactPaths
    from pipeline.verifier_record import verifier_identity

    paths = ArtifactPaths(tmp_path / "artifacts", tmp_path / "metrics", tmp_path / "plots")
    paths.verifier.mkdir(parents=True)
    (paths.verifier / "verifier.json").write_text(json.dumps({"source": "hf", "name_or_path": "/", "hash": "0" * 64,
                                                             "id": "v-000000000000"}))
    with pytest.raises(DraftlineError, match=r"is not at / \(no config.json\)"):
        verifier_identity(paths)


def _promote_once(ws, capsys) -> tuple[int, str]:
    from pipeline.promote import promote

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ws.root)
        code = promote.main(["--params", str(ws.params)])
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize("file, content, expected", [
    ("artifacts/drafters/ar/training.json", [], "training.json is not a training record"),
    ("artifacts/drafters/ar/training.json", {"lineage": "v1"}, "training.json is not a training record"),
    ("metrics/eval.json", {"drafters": {"ar": "fast"}}, r"the entry of \['ar'\] is not an object"),
    ("metrics/eval.json", {"drafters": {"ar": {"by_temperature": "fast"}}}, r"the entry of \['ar'\] is not an object"),
    ("metrics/eval.json", {"drafters": {"ar": {"by_temperature": {"0.0": {"code": 2.0}}}}}, "is not an object"),
    ("metrics/serving.json", {"drafters": ["ar"]}, "serving.json is not a serve_check report"),
    ("metrics/serving.json", {"drafters": {"ar": [1]}}, "serving.json is not a serve_check report"),
])
def test_promote_reads_malformed_records_as_one_line(tmp_path, capsys, file, content, expected):
    """Valid JSON of the wrong shape (a list where an object belongs) was an AttributeError traceback."""
    from tests.support.promotion import ready_workspace

    tiny_tokenizer().save_pretrained(tmp_path / "tokenizer")
    ws = ready_workspace(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}", "shapes", tmp_path / "tokenizer")
    if file == "metrics/serving.json":
        params = yaml.safe_load(ws.params.read_text())
        params["serve_check"] = {"required": True}  # so that serving.json is read
        ws.params.write_text(json.dumps(params))
    if file == "metrics/eval.json":
        recorded = json.loads((ws.root / file).read_text())
        content = {**recorded, **content}
    (ws.root / file).write_text(json.dumps(content))
    code, err = _promote_once(ws, capsys)
    assert code == 1 and "Traceback" not in err, err[-2000:]
    assert err.splitlines()[-1].startswith("draftline: error: ") and re.search(expected, err.splitlines()[-1]), err


def test_the_gate_reads_a_malformed_by_temperature_as_missing_metrics():
    from pipeline.promote.gate import gate_metrics

    for entry in ({"by_temperature": "fast"}, {"by_temperature": {"0.0": ["code"]}}, {"by_temperature": None}):
        assert set(gate_metrics(entry)) == {"lossless", "mismatches"}  # no domain: the floors refuse it


def test_a_fifo_in_a_model_directory_is_refused_before_anything_reads_it(tmp_path):
    from pipeline.integrity import check_drafter_matches_verifier, check_loadable_dir

    model = tiny_qwen3(64, num_layers=1)
    model.save_pretrained(tmp_path / "ar")
    (tmp_path / "ar" / "config.json").unlink()
    os.mkfifo(tmp_path / "ar" / "config.json")  # json.loads(read_text()) would block forever
    for check in (lambda: check_loadable_dir(tmp_path / "ar", "fix"),
                  lambda: check_drafter_matches_verifier(tmp_path / "ar", model.config, "drafter", "fix")):
        with pytest.raises(DraftlineError, match="holds config.json, which is not a regular file"):
            check()


@pytest.mark.parametrize("listed", ["/dev/zero", "../../outside.bin"])
def test_a_manifest_naming_files_outside_the_export_is_refused(tmp_path, listed):
    """Hashing what a manifest lists must stay inside the export: `/dev/zero` would never end."""
    from pipeline.integrity import verify_manifest

    export = tmp_path / "a" / "export"
    export.mkdir(parents=True)
    (tmp_path / "outside.bin").write_bytes(b"")
    (export / "manifest.json").write_text(json.dumps({"files": {listed: {"bytes": 0, "sha256": "0" * 64}}}))
    with pytest.raises(DraftlineError, match=f"lists {re.escape(listed)}, outside"):
        verify_manifest(export)


def _hold_lock_in_another_process(lock_path: Path) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", f"import sys, time; from filelock import FileLock; "
                               f"lock = FileLock({str(lock_path)!r}); lock.acquire(); print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_training_on_one_checkpoint_dir_is_refused(tmp_path):
    """Both used to run: interleaved checkpoints, and the second marked the first's live MLflow run KILLED."""
    from train.trainer import single_writer

    checkpoints = tmp_path / "checkpoints" / "ar"
    holder = _hold_lock_in_another_process(tmp_path / "checkpoints" / "ar.lock")
    try:
        with pytest.raises(DraftlineError, match=f"another training is running on {checkpoints}"):
            with single_writer(checkpoints):
                pass
    finally:
        holder.kill()
        holder.wait()
    with single_writer(checkpoints):  # released by the OS when its holder died
        pass


@pytest.mark.parametrize("plant", ["directory", "symlink"])
def test_a_lock_path_that_is_not_a_plain_file_is_one_line(tmp_path, plant):
    """A directory, or a symlink (never followed: it could point at a file the lock would clobber)."""
    from pipeline.promote.model_registry import registry_lock
    from train.trainer import single_writer

    for lock_path, take in ((tmp_path / "mlflow.db.draftline.lock", lambda: registry_lock(f"sqlite:///{tmp_path}/mlflow.db")),
                            (tmp_path / "ar.lock", lambda: single_writer(tmp_path / "ar"))):
        victim = tmp_path / f"{lock_path.name}.victim"
        victim.write_text("precious")
        lock_path.mkdir() if plant == "directory" else lock_path.symlink_to(victim)
        with pytest.raises(DraftlineError, match=f"cannot take the .* lock {lock_path} .*remove what is there"):
            with take():
                pass
        assert victim.read_text() == "precious"


def test_an_output_dir_that_is_a_file_is_one_line(tmp_path):
    from pipeline.config.schema import parse_all
    from pipeline.paths import ArtifactPaths

    (tmp_path / "metrics").write_text("not a directory")
    with pytest.raises(DraftlineError, match="project.metrics_dir '.*metrics' exists and is not a directory"):
        ArtifactPaths.from_params(parse_all({}), tmp_path)


def test_a_prompt_path_for_an_unknown_user_is_one_line():
    from data_prep.sources import load_source
    from pipeline.config.corpus_config import PromptSourceConfig

    with pytest.raises(DraftlineError, match="cannot expand '~'"):
        load_source(PromptSourceConfig(kind="file", path="~no-such-user-draftline/p.jsonl", domain="text"))


def test_the_error_line_comes_after_the_progress_bar_it_interrupted(capsys):
    """A stage failing mid-bar printed its error, then the bar redrew itself at exit as the last line."""
    from pipeline.cli import report_error
    from pipeline.progress import progress

    bar = progress(desc="build corpus", total=10, unit="prompt")
    bar.update(3)
    assert report_error(DraftlineError("the server answered nonsense")) == 1
    err = capsys.readouterr().err
    assert err.endswith("draftline: error: the server answered nonsense\n"), err[-300:]
    del bar
    assert capsys.readouterr().err == ""  # closed once: nothing more when it is collected
