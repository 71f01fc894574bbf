"""TensorRT: the pure parts (availability, profiles, precision plan) and `required` without CUDA."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from export import tensorrt_build
from pipeline.config.export_config import ExportConfig, ProfileConfig
from pipeline.drafters.ar import onnx as ar_onnx
from pipeline.drafters.block import onnx as block_onnx
from pipeline.drafters.onnx_spec import with_float_dtype
from pipeline.errors import DraftlineError
from tests.support.tiny_models import tiny_qwen3

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ar_spec():
    return ar_onnx.io_spec(tiny_qwen3(320, num_layers=2).config)


def test_profile_shapes_cover_every_dynamic_input(ar_spec):
    profile = ProfileConfig(batch=(1, 2, 4), seq=(1, 8, 64), past=(0, 64, 512))
    shapes = tensorrt_build.profile_shapes(ar_spec, profile)
    assert set(shapes) == set(ar_spec.input_names)
    assert shapes["input_ids"] == ((1, 1), (2, 8), (4, 64))
    assert shapes["past_key.1"] == ((1, 2, 0, 8), (2, 2, 64, 8), (4, 2, 512, 8))


def test_profile_never_asks_for_an_empty_batch_or_sequence(ar_spec):
    shapes = tensorrt_build.profile_shapes(ar_spec, ProfileConfig(batch=(0, 1, 2), seq=(0, 0, 4), past=(0, 0, 8)))
    assert shapes["input_ids"][0] == (1, 1) and shapes["input_ids"][1] == (1, 1)
    assert shapes["past_value.0"][0][2] == 0  # an empty cache is a real input (the first forward)


def test_block_profile_keeps_static_dims():
    from pipeline.drafters.block.model import DFlashConfig, DFlashDraftModel

    config = DFlashConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=8, intermediate_size=64, vocab_size=320, block_size=4, num_target_layers=4,
                          dflash_config={"mask_token_id": 1, "target_layer_ids": [0, 2]})
    spec = block_onnx.io_spec(DFlashDraftModel(config), 320)
    shapes = tensorrt_build.profile_shapes(spec, ProfileConfig(batch=(1, 1, 2), seq=(1, 3, 8), past=(0, 16, 32)))
    assert shapes["anchor_ids"] == ((1,), (1,), (2,))
    assert shapes["context_features"] == ((1, 1, 32), (1, 3, 32), (2, 8, 32))
    assert shapes["past_context_key.0"][2] == (2, 2, 32, 8)
    assert shapes["past_context_positions"][1] == (1, 16)


@pytest.mark.parametrize("precision, major, dtype, flags, strong", [
    ("fp32", 11, "float32", (), True),
    ("fp16", 11, "float16", (), True),
    ("bf16", 11, "bfloat16", (), True),
    ("fp32", 10, "float32", (), False),
    ("fp16", 10, "float32", ("FP16",), False),
    ("bf16", 10, "float32", ("BF16",), False),
])
def test_precision_plan(precision, major, dtype, flags, strong):
    plan = tensorrt_build.precision_plan(precision, major)
    assert (plan.onnx_dtype, plan.builder_flags, plan.strongly_typed) == (dtype, flags, strong)


def test_precision_plan_rejects_old_tensorrt_and_unknown_precision():
    with pytest.raises(DraftlineError, match="too old"):
        tensorrt_build.precision_plan("fp16", 8)
    with pytest.raises(DraftlineError, match="unknown TensorRT precision"):
        tensorrt_build.precision_plan("int8", 11)


def test_reduced_precision_spec_casts_only_floating_tensors(ar_spec):
    half = with_float_dtype(ar_spec, "float16")
    dtypes = {t.name: t.dtype for t in (*half.inputs, *half.outputs)}
    assert dtypes["input_ids"] == "int64" and dtypes["past_key.0"] == "float16" and dtypes["logits"] == "float16"


def test_tensorrt_modes(monkeypatch):
    monkeypatch.setattr(tensorrt_build, "tensorrt_unavailable_reason", lambda: "no CUDA device is available")
    assert tensorrt_build.check_tensorrt_mode(ExportConfig(tensorrt="auto")) == "no CUDA device is available"
    assert tensorrt_build.check_tensorrt_mode(ExportConfig(tensorrt="off")) == "export.tensorrt is 'off'"
    with pytest.raises(DraftlineError, match="'required' but no CUDA device"):
        tensorrt_build.check_tensorrt_mode(ExportConfig(tensorrt="required"))
    monkeypatch.setattr(tensorrt_build, "tensorrt_unavailable_reason", lambda: None)
    assert tensorrt_build.check_tensorrt_mode(ExportConfig(tensorrt="required")) is None


@pytest.mark.skipif(tensorrt_build.tensorrt_unavailable_reason() is None, reason="TensorRT and CUDA are present")
def test_required_without_cuda_exits_with_one_clear_line(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"project": {"artifacts_dir": str(tmp_path / "artifacts")},
                                      "export": {"tensorrt": "required"}}))
    result = subprocess.run([sys.executable, "-m", "export.export", "--params", str(params)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "export.tensorrt is 'required' but" in lines[0] and "export.tensorrt: auto" in lines[0]
