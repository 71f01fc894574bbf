"""Feature engine `vllm` (data_prep/feature_engines/vllm_engine.py): the real `vllm serve` from `.venv-serve`
with `extract_hidden_states` writes the same hidden states as HF's forward, layer by layer."""

from __future__ import annotations

import random

import pytest
import torch

from data_prep.feature_engines.vllm_engine import VllmFeatureEngine
from pipeline.config.vllm_config import VllmConfig
from pipeline.errors import DraftlineError
from pipeline.serving_venv import serve_python
from tests.support.tiny_models import save_tiny_verifier

# vLLM fp32 vs HF fp32, per layer: measured 2e-7 on this model (1e-4 on the 6-layer demo verifier, whose
# states are larger); 1e-4 leaves room for other CPUs' kernels and still catches a wrong layer or token
TOLERANCE = 1e-4
NUM_LAYERS = 4


def hf_states(model, row: list[int], layers: list[int]) -> dict[int, torch.Tensor]:
    """HF's `hidden_states[i]`, except layer N read before the final norm (the feature store's numbering)."""
    captured = {}
    hook = model.model.norm.register_forward_pre_hook(lambda module, args: captured.update(last=args[0]))
    try:
        with torch.no_grad():
            states = model(torch.tensor([row]), output_hidden_states=True).hidden_states
    finally:
        hook.remove()
    return {layer: (captured["last"] if layer == NUM_LAYERS else states[layer])[0] for layer in layers}


def test_missing_serve_env_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTLINE_SERVE_PYTHON", str(tmp_path / "nowhere" / "python"))
    engine = VllmFeatureEngine("verifier", VllmConfig(), dtype="float32", work_dir=tmp_path)
    with pytest.raises(DraftlineError, match=r"features.engine is 'vllm' .*make serve-env"):
        engine.extract([[1, 2, 3]], [NUM_LAYERS])


@pytest.mark.slow
@pytest.mark.skipif(serve_python() is None, reason="no serving environment (make serve-env)")
def test_vllm_states_equal_hf_per_layer(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: the rows need little
    model, tokenizer = save_tiny_verifier(tmp_path / "verifier", num_layers=NUM_LAYERS, hidden_size=128)
    rng = random.Random(0)
    # lengths from 1 token to several KV blocks; a repeated row and one extending another
    # (prefix-cache hits) must get their states all the same
    rows = [[rng.randrange(3, len(tokenizer)) for _ in range(length)] for length in (1, 2, 17, 130, 300, 45, 64)]
    rows += [rows[3], rows[2] + rows[5]]
    layers = [NUM_LAYERS, 1, 2]  # unsorted on purpose: vLLM's file holds them in ascending order
    config = VllmConfig(max_model_len=512, extra_args=["--enforce-eager"])
    engine = VllmFeatureEngine(str(tmp_path / "verifier"), config, dtype="float32", work_dir=tmp_path / "work")
    try:
        extracted = engine.extract(rows, layers)
        with pytest.raises(DraftlineError, match="rejected a row of 600 tokens"):  # past max_model_len
            engine.extract([[5] * 600], layers)
        embeddings = engine.extract(rows[:3], [0])  # other layers: the server restarts for them
        description = engine.describe()
    finally:
        engine.close()
    assert not (tmp_path / "work" / "hidden_states").exists()
    assert description["name"] == "vllm" and description["version"] not in ("", "unknown")
    worst = dict.fromkeys(sorted(layers), 0.0)
    for row, states in zip(rows, extracted):
        assert sorted(states) == sorted(layers)
        for layer, reference in hf_states(model, row, layers).items():
            assert states[layer].dtype == torch.float32 and states[layer].shape == (len(row), 128)
            worst[layer] = max(worst[layer], (states[layer] - reference).abs().max().item())
    for row, states in zip(rows, embeddings):
        assert list(states) == [0] and torch.equal(states[0], hf_states(model, row, [0])[0])
    with capsys.disabled():
        print("\nvllm vs HF hidden states (fp32), max abs diff per layer: "
              + ", ".join(f"{layer}: {diff:.1e}" for layer, diff in worst.items()))
    assert max(worst.values()) <= TOLERANCE, worst
