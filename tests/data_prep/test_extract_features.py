"""extract_features: features equal the verifier's HF hidden states; shards resume byte for byte after a kill,
a damaged shard is redone, `--part` copies merge into the single run's bytes; bad inputs are one line."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import SafetensorError

from data_prep import extract_features
from data_prep.corpus import SPLITS, corpus_hash, load_corpus
from pipeline.drafters.registry import KIND_SPECS
from pipeline.features import store
from pipeline.features.store import INDEX_NAME, FeatureStore
from pipeline.paths import ArtifactPaths
from pipeline.training.corpus_data import row_sequence
from pipeline.verifier_record import verifier_identity
from tests.support.workspace import make_artifacts

# 18 rows (12 / 4 / 2) in shards of 4: 3 + 1 + 1 = 5 shards
SHARDS = ["train-00000", "train-00001", "train-00002", "validation-00000", "test-00000"]


def write_params(root: Path, **features) -> Path:
    params = {"project": {"artifacts_dir": str(root / "artifacts"), "metrics_dir": str(root / "metrics")},
              "features": {"dtype": "float32", "shard_rows": 4, "batch_size": 3, "max_seq_len": 24, **features},
              "train": {name: {"trainer": {"max_seq_len": 24}} for name in KIND_SPECS}}
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """A workspace with a 2-layer verifier and its corpus, extracted once without interruption."""
    root = tmp_path_factory.mktemp("features")
    make_artifacts(root)
    assert extract_features.main(["--params", str(write_params(root))]) == 0
    return root


@pytest.fixture
def workspace(reference, tmp_path) -> Path:
    """A copy of the reference workspace, without its features."""
    root = tmp_path / "copy"
    shutil.copytree(reference, root, ignore=shutil.ignore_patterns("features", "metrics"))
    write_params(root)
    return root


def shard_bytes(root: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted((root / "artifacts" / "features").iterdir())}


def run(root: Path, *args: str) -> int:
    return extract_features.main(["--params", str(root / "params.yaml"), *args])


def one_line_error(capsys) -> str:
    """The error line, which ends the output (after the stage's own progress lines), with no traceback."""
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert "Traceback" not in err and [line for line in lines if "error" in line] == lines[-1:], lines
    return lines[-1]


def test_features_are_the_verifiers_hidden_states(reference):
    paths = ArtifactPaths.from_params(extract_features.FeaturesParams(project={
        "artifacts_dir": str(reference / "artifacts")}))
    from data_prep.verifier import load_verifier

    model, _ = load_verifier(paths)
    store = FeatureStore(paths.features)
    store.check(verifier_hash=verifier_identity(paths)["hash"], corpus_hash=corpus_hash(paths), num_layers=2,
                hidden_size=32, layers={1, 2}, max_seq_len=24, what="this test")
    assert store.index.layers == [1, 2]  # the kinds' layers on a 2-layer verifier, and N
    corpus = load_corpus(paths)
    for split in SPLITS:
        assert store.rows(split) == len(corpus[split])
        for index, row in enumerate(corpus[split]):
            tokens, prompt_len = row_sequence(row["prompt_ids"], row["response_ids"], 24)
            (stored,) = store.read_rows(split, [index])
            assert stored.input_ids.tolist() == tokens and stored.prompt_len == prompt_len
            with torch.no_grad():
                hidden = model.model(torch.tensor([tokens]), output_hidden_states=True).hidden_states
            # layers below N as HF numbers them; N before the final norm, so norm(N) is HF's last
            torch.testing.assert_close(stored.layers[1], hidden[1][0], atol=1e-5, rtol=1e-5)
            with torch.no_grad():
                torch.testing.assert_close(model.model.norm(stored.layers[2]), hidden[2][0], atol=1e-5, rtol=1e-5)
            assert not torch.allclose(stored.layers[2], hidden[2][0], atol=1e-3)
    metrics = json.loads((reference / "metrics" / "features.json").read_text())
    assert metrics["rows"] == 18 and metrics["shards"] == {"total": 5, "reused": 0, "written": 5}
    assert metrics["bytes"] == sum((paths.features / f"{name}.safetensors").stat().st_size for name in SHARDS)
    assert metrics["bytes_per_token"] == round(metrics["bytes"] / metrics["tokens"], 1)


def test_a_killed_extraction_resumes_to_the_same_bytes(reference, workspace, capsys):
    """What a SIGKILL can leave: no index, a shard never written but its partial file, a shard written but
    not its sha256; the rest committed."""
    features = workspace / "artifacts" / "features"
    shutil.copytree(reference / "artifacts" / "features", features)
    (features / INDEX_NAME).unlink()
    (features / "train-00001.safetensors").rename(features / "train-00001.safetensors.partial")
    (features / "test-00000.safetensors.sha256").unlink()
    (features / "vllm-serve.log").write_text("an engine's log")
    capsys.readouterr()
    assert run(workspace) == 0
    assert "3 / 2 of 5" in capsys.readouterr().err
    (features / "vllm-serve.log").unlink()  # kept
    assert shard_bytes(workspace) == shard_bytes(reference)  # the partial file is gone


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_shard_is_redone(reference, workspace, capsys, damage):
    features = workspace / "artifacts" / "features"
    shutil.copytree(reference / "artifacts" / "features", features)
    shard = features / "train-00002.safetensors"
    data = bytearray(shard.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data) if damage == "flip" else bytes(data[: len(data) // 2]))
    capsys.readouterr()
    assert run(workspace) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "train-00002.safetensors is damaged" in err and "4 / 1 of 5" in err
    assert shard_bytes(workspace) == shard_bytes(reference)


def test_parts_then_a_merging_run_equal_one_run(reference, workspace, capsys):
    features = workspace / "artifacts" / "features"
    assert run(workspace, "--part", "0/2") == 0
    assert not (features / INDEX_NAME).exists()  # a part writes no index
    assert sorted(path.name for path in features.glob("*.safetensors")) == [
        f"{name}.safetensors" for name in sorted(SHARDS[0::2])]
    assert run(workspace, "--part", "1/2") == 0
    capsys.readouterr()
    assert run(workspace) == 0
    assert "5 / 0 of 5" in capsys.readouterr().err  # the merge extracts nothing
    assert shard_bytes(workspace) == shard_bytes(reference)


@pytest.mark.parametrize("part", ["2/2", "1/0", "-1/2", "a/b", "1"])
def test_a_bad_part_is_one_line(workspace, capsys, part):
    assert run(workspace, f"--part={part}") == 1
    assert f"--part '{part}': expected i/N" in one_line_error(capsys)


def test_missing_corpus_is_one_line(workspace, capsys):
    shutil.rmtree(workspace / "artifacts" / "corpus")
    assert run(workspace) == 1
    assert "no corpus at" in one_line_error(capsys)


def test_no_offline_kind_leaves_an_empty_dataset(reference, workspace, capsys):
    features = workspace / "artifacts" / "features"
    shutil.copytree(reference / "artifacts" / "features", features)
    params = yaml.safe_load((workspace / "params.yaml").read_text())
    for section in params["train"].values():
        section["features"] = "online"
    (workspace / "params.yaml").write_text(yaml.safe_dump(params))
    assert run(workspace) == 0
    assert "nothing to extract" in capsys.readouterr().err
    assert sorted(path.name for path in features.iterdir()) == [INDEX_NAME]  # the other inputs' shards removed
    store = FeatureStore(features)
    assert store.index.layers == [] and store.rows("train") == 0
    assert json.loads((workspace / "metrics" / "features.json").read_text())["rows"] == 0


def test_each_kinds_feature_params_are_its_config_fields():
    """dvc.yaml reruns extract_features on exactly these keys (pipeline/dvc_pipeline.py: feature_params)."""
    for spec in KIND_SPECS.values():
        assert set(spec.feature_params) <= set(spec.config.model_fields), spec.name


@pytest.mark.parametrize("failure", [
    SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),  # what it raises
    OSError(errno.ENOSPC, "No space left on device"),  # a writer that names no file
])
def test_a_full_disk_is_one_line_naming_the_shard_and_leaves_no_partial_file(workspace, capsys, monkeypatch,
                                                                              failure):
    def full_disk(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\0" * 100)  # what a write cut short leaves
        raise failure

    monkeypatch.setattr(store, "save_file", full_disk)
    assert run(workspace) == 1
    features = workspace / "artifacts" / "features"
    line = one_line_error(capsys)
    assert f"no space left on the disk holding {features / 'train-00000.safetensors'} (No space left on device; " in line
    assert " free there; the write needed at least " in line and "iB" in line
    assert sorted(path.name for path in features.iterdir() if not path.name.endswith(".log")) == []
