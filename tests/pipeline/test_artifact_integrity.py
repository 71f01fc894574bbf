"""Damaged or mismatched artifacts are refused with one line before anything loads or is written."""

from __future__ import annotations

import json
import shutil

import pytest

from pipeline.errors import DraftlineError
from pipeline.integrity import safetensors_shapes, verify_manifest
from tests.support.tiny_models import tiny_qwen3
from tests.support.workspace import evaluate_params


@pytest.fixture
def copy(tiny_workspace, tmp_path, monkeypatch):
    root = tmp_path / "project"
    shutil.copytree(tiny_workspace, root)
    monkeypatch.chdir(root)
    return root


def _truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    return err.splitlines()[-1]


def test_truncated_weights_are_detected_from_the_header(tmp_path):
    model = tiny_qwen3(320, num_layers=1)
    model.save_pretrained(tmp_path)
    assert "model.embed_tokens.weight" in safetensors_shapes(tmp_path, "fix")
    _truncate(tmp_path / "model.safetensors")
    with pytest.raises(DraftlineError, match="model.safetensors is truncated"):
        safetensors_shapes(tmp_path, "fix")


@pytest.mark.parametrize("damaged", ["artifacts/drafters/ar/model.safetensors", "artifacts/verifier/model.safetensors"])
def test_evaluate_refuses_truncated_weights(copy, capsys, damaged):
    from serve_eval.evaluate import main

    _truncate(copy / damaged)
    assert main(["--params", evaluate_params(copy, temperatures=[0.0])]) == 1
    line = _one_line(capsys)
    assert "model.safetensors is truncated" in line
    assert not (copy / "metrics" / "eval.json").exists()


def _wider_ar_drafter(root, extra=16):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(root / "artifacts" / "drafters" / "ar")
    drafter = tiny_qwen3(len(tokenizer) + extra, num_layers=1, seed=5)
    drafter.save_pretrained(root / "artifacts" / "drafters" / "ar")


def test_evaluate_refuses_a_drafter_with_another_vocabulary(copy, capsys):
    from serve_eval.evaluate import main

    _wider_ar_drafter(copy)
    assert main(["--params", evaluate_params(copy, temperatures=[0.8])]) == 1
    line = _one_line(capsys)
    assert "vocab_size" in line and "differs from the verifier's" in line


def test_export_refuses_a_drafter_with_another_vocabulary(copy, capsys):
    from export.export import main

    _wider_ar_drafter(copy)
    (copy / "params.yaml").write_text(json.dumps({"export": {"kinds": ["ar"], "tensorrt": "off"}}))
    assert main(["--params", str(copy / "params.yaml")]) == 1
    assert "differs from the verifier's" in _one_line(capsys)
    assert not (copy / "artifacts" / "export").exists()


def test_manifest_catches_a_file_changed_after_export(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"onnx bytes")
    from export.manifest import file_table

    (tmp_path / "manifest.json").write_text(json.dumps({"files": file_table(tmp_path)}))
    verify_manifest(tmp_path)
    (tmp_path / "model.onnx").write_bytes(b"onnx byte")
    with pytest.raises(DraftlineError, match="model.onnx differs from .*manifest.json"):
        verify_manifest(tmp_path)
    (tmp_path / "model.onnx").unlink()
    with pytest.raises(DraftlineError, match="model.onnx listed in .* is missing"):
        verify_manifest(tmp_path)
