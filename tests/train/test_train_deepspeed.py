"""DeepSpeed ZeRO-2 and ZeRO-3 on CPU with 2 processes (CPUDeepSpeedStrategy), through the real stage CLI."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline.config.trainer_config import TrainerConfig
from tests.support.training import assert_trained, run_train, write_params
from tests.support.workspace import make_artifacts
from train.strategies import CPUDeepSpeedStrategy, make_strategy


def test_make_strategy_picks_cpu_deepspeed_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("the CPU subclass is chosen only without CUDA")
    strategy = make_strategy(TrainerConfig(strategy="deepspeed_stage_3", offload_optimizer=True))
    assert isinstance(strategy, CPUDeepSpeedStrategy)
    assert strategy.config["zero_optimization"]["stage"] == 3
    assert strategy.config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert make_strategy(TrainerConfig(strategy="auto")) == "auto"


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["deepspeed_stage_2", "deepspeed_stage_3"])
def test_deepspeed_two_processes_on_cpu(tmp_path, strategy):
    make_artifacts(tmp_path)
    steps = 6
    params_path = write_params(tmp_path, {"strategy": strategy, "devices": 2, "accelerator": "cpu",
                                          "max_steps": steps, "checkpoint_every_n_steps": 3})
    result = run_train(params_path)
    info = assert_trained(tmp_path, result, steps)
    assert info["world_size"] == 2
    assert info["strategy"] == strategy
    # DeepSpeed checkpoints are directories (one shard per rank under ZeRO-3).
    assert (tmp_path / "artifacts" / "checkpoints" / "ar" / "last.ckpt").is_dir()
    metrics = json.loads((tmp_path / "metrics" / "train_ar.json").read_text())
    assert metrics["steps"] == steps

    # A rerun resumes from those shards, unpickled weights-only with only DeepSpeed's own classes allowed
    # (DeepSpeed itself would load them with weights_only=False).
    resumed = run_train(params_path)
    assert "resuming from" in resumed.stderr and "Restored all states" in resumed.stderr
    assert assert_trained(tmp_path, resumed, steps)["world_size"] == 2


@pytest.mark.slow
def test_zero3_on_cpu_compiles_nothing_and_finishes(tmp_path, monkeypatch):
    """ZeRO-3 on CPU, 2 steps, from a cold extension cache: DeepSpeed used to JIT-compile its shared-memory op
    (~150 s on 2 cores, which only inference uses) before the first step; now nothing is compiled."""
    make_artifacts(tmp_path)
    extensions = tmp_path / "torch_extensions"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(extensions))
    params_path = write_params(tmp_path, {"strategy": "deepspeed_stage_3", "accelerator": "cpu", "max_steps": 2})
    assert_trained(tmp_path, run_train(params_path), 2)
    assert not any(extensions.rglob("*.so")), sorted(extensions.rglob("*"))


@pytest.mark.slow
def test_zero3_with_the_optimizer_offloaded_trains(tmp_path):
    """ZeRO-Offload refuses a torch optimizer (a ZeRORuntimeException traceback): offloading uses DeepSpeed's CPU Adam."""
    make_artifacts(tmp_path)
    params_path = write_params(tmp_path, {"strategy": "deepspeed_stage_3", "accelerator": "cpu", "max_steps": 2,
                                          "offload_optimizer": True})
    assert_trained(tmp_path, run_train(params_path, timeout=400), 2)
