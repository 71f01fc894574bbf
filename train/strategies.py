"""Lightning strategies from params: `auto`, `ddp`, and DeepSpeed ZeRO-2/3 on GPUs *and* on CPU.

Lightning refuses DeepSpeed without CUDA, but DeepSpeed itself runs on its CPU accelerator with gloo,
so `CPUDeepSpeedStrategy` lifts the two Lightning-side checks (docs/algorithms.md#deepspeed-on-cpu). That keeps the
DeepSpeed path exercised in CI, not only on GPU machines.

Launchers: Lightning picks the cluster environment from the standard variables (torchrun's
`LOCAL_RANK`/`WORLD_SIZE`/`MASTER_ADDR`, SLURM's `SLURM_*`, the `deepspeed` launcher's
`RANK`/`LOCAL_RANK`), so the same params run under `torchrun`, `srun` or `deepspeed` unchanged.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from unittest import mock

import torch
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, Strategy

from pipeline.config.trainer_config import TrainerConfig

# What DeepSpeed's ZeRO optimizer shards pickle besides tensors and builtins (listed by
# torch.serialization.get_unsafe_globals_in_checkpoint on ZeRO-2 and ZeRO-3 checkpoints; DynamicLossScaler
# replaces LossScaler under fp16). Resumes unpickle with `weights_only=True` and exactly these allowed.
DEEPSPEED_CHECKPOINT_GLOBALS = (
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.utils.tensor_fragment.fragment_address",
)
CHECKPOINT_GLOBAL_NAMES = frozenset(DEEPSPEED_CHECKPOINT_GLOBALS)


def deepspeed_checkpoint_globals() -> list[type]:
    """The classes named in DEEPSPEED_CHECKPOINT_GLOBALS (imported only when DeepSpeed is in use)."""
    found = []
    for name in DEEPSPEED_CHECKPOINT_GLOBALS:
        module, _, attribute = name.rpartition(".")
        found.append(getattr(importlib.import_module(module), attribute))
    return found


class WeightsOnlyLoads:
    """A DeepSpeed checkpoint engine whose `load` unpickles weights-only. DeepSpeed 0.19's own engine loads
    every shard with `weights_only=False` and Lightning's `Trainer.fit(weights_only=...)` never reaches it,
    so a planted `*.pt` in a checkpoint dir would run its code; saving and everything else is delegated."""

    def __init__(self, engine) -> None:
        self._engine = engine

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def load(self, path: str | Path, map_location=None):
        with torch.serialization.safe_globals(deepspeed_checkpoint_globals()):
            return torch.load(path, map_location=map_location, weights_only=True)


class WeightsOnlyDeepSpeedStrategy(DeepSpeedStrategy):
    """DeepSpeed ZeRO whose resumes load checkpoint shards weights-only (see WeightsOnlyLoads)."""

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict:
        engine = self.deepspeed_engine
        own = engine.checkpoint_engine
        engine.checkpoint_engine = WeightsOnlyLoads(own)
        try:
            return super().load_checkpoint(checkpoint_path, weights_only=True)
        finally:
            engine.checkpoint_engine = own


class CPUDeepSpeedStrategy(WeightsOnlyDeepSpeedStrategy):
    """DeepSpeed ZeRO on the CPU accelerator (gloo), one process per `devices`."""

    def setup_environment(self) -> None:
        # Skip DeepSpeedStrategy's CUDA-only check; DDPStrategy's setup still runs setup_distributed.
        DDPStrategy.setup_environment(self)

    def setup_distributed(self) -> None:
        # Skip the device-index validation: CPU "devices" carry no index.
        reset_seed()
        self.set_world_ranks()
        # DeepSpeed's CPU backend JIT-compiles a C++ shared-memory op when it starts (measured: ~150 s on 2 cores
        # the first time on a machine, then cached) that only `inference_all_reduce` uses; training never
        # calls it, so it is not built. (`deepspeed.comm.torch` as an attribute is the torch module: import by name.)
        backend = importlib.import_module("deepspeed.comm.torch")
        with mock.patch.object(backend, "build_shm_op", lambda: None):
            self._init_deepspeed_distributed()

    @property
    def root_device(self) -> torch.device:
        return torch.device("cpu", self.local_rank)

    def _get_process_group_backend(self) -> str:
        return self._process_group_backend or "gloo"


def uses_gpu(cfg: TrainerConfig) -> bool:
    if cfg.accelerator == "gpu":
        return True
    return cfg.accelerator == "auto" and torch.cuda.is_available()


def make_strategy(cfg: TrainerConfig) -> Strategy | str:
    """The Lightning strategy for `cfg.strategy` (+ offload options); a name Lightning resolves otherwise."""
    if cfg.strategy == "auto":
        return "auto"
    if cfg.strategy == "ddp":
        # gloo on CPU, nccl on GPU: Lightning chooses from the device type.
        return DDPStrategy(find_unused_parameters=False)
    stage = 3 if cfg.strategy == "deepspeed_stage_3" else 2
    strategy_class = WeightsOnlyDeepSpeedStrategy if uses_gpu(cfg) else CPUDeepSpeedStrategy
    return strategy_class(
        stage=stage,
        offload_optimizer=cfg.offload_optimizer,
        offload_parameters=cfg.offload_parameters,
        # Frozen parameters (none are registered, see the modules) would otherwise bloat checkpoints.
        exclude_frozen_parameters=True,
        # Batches come pre-built from the data modules, so DeepSpeed cannot infer the micro-batch size.
        logging_batch_size_per_gpu=cfg.batch_size,
    )
