"""The step budget: `train.<kind>.trainer.epochs` turned into optimizer steps for the corpus at hand."""

from __future__ import annotations

import math

import torch

from pipeline.config.trainer_config import TrainerConfig
from pipeline.progress import info


def resolve_budget(cfg: TrainerConfig, train_rows: int) -> TrainerConfig:
    """`cfg` with `max_steps` from `epochs` when those are set: optimizer steps per pass over `train_rows`
    rows, split over every device (each rank sees its shard), grouped by gradient accumulation."""
    if cfg.epochs is None:
        return cfg
    world = (cfg.devices if isinstance(cfg.devices, int) else max(1, torch.cuda.device_count())) * cfg.num_nodes
    batches = math.ceil(train_rows / (cfg.batch_size * world))
    steps = max(1, math.ceil(cfg.epochs * batches / cfg.accumulate_grad_batches))
    info(f"training budget: {cfg.epochs:g} epochs of {train_rows} rows = {steps} optimizer steps")
    return cfg.model_copy(update={"max_steps": steps})
