"""Lightning strategies from params: `auto`, `ddp`, and DeepSpeed ZeRO-2/3 on GPUs *and* on CPU.

Lightning refuses DeepSpeed without CUDA, but DeepSpeed itself runs on its CPU accelerator with gloo,
so `CPUDeepSpeedStrategy` lifts the two Lightning-side checks (docs/algorithms.md#deepspeed-on-cpu). That keeps the
DeepSpeed path exercised in CI, not only on GPU machines.

Launchers: Lightning picks the cluster environment from the standard variables (torchrun's
`LOCAL_RANK`/`WORLD_SIZE`/`MASTER_ADDR`, SLURM's `SLURM_*`, the `deepspeed` launcher's
`RANK`/`LOCAL_RANK`), so the same params run under `torchrun`, `srun` or `deepspeed` unchanged.
"""

from __future__ import annotations

import torch
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, Strategy

from pipeline.config.trainer_config import TrainerConfig


class CPUDeepSpeedStrategy(DeepSpeedStrategy):
    """DeepSpeed ZeRO on the CPU accelerator (gloo), one process per `devices`."""

    def setup_environment(self) -> None:
        # Skip DeepSpeedStrategy's CUDA-only check; DDPStrategy's setup still runs setup_distributed.
        DDPStrategy.setup_environment(self)

    def setup_distributed(self) -> None:
        # Skip the device-index validation: CPU "devices" carry no index.
        reset_seed()
        self.set_world_ranks()
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
    strategy_class = DeepSpeedStrategy if uses_gpu(cfg) else CPUDeepSpeedStrategy
    return strategy_class(
        stage=stage,
        offload_optimizer=cfg.offload_optimizer,
        offload_parameters=cfg.offload_parameters,
        # Frozen parameters (none are registered, see the modules) would otherwise bloat checkpoints.
        exclude_frozen_parameters=True,
        # Batches come pre-built from the data modules, so DeepSpeed cannot infer the micro-batch size.
        logging_batch_size_per_gpu=cfg.batch_size,
    )
