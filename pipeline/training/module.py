"""The base of every kind's LightningModule: AdamW + cosine warm-up, and the token count kept in checkpoints."""

from __future__ import annotations

from typing import Iterable

import torch
from lightning.pytorch import LightningModule
from torch import nn
from transformers import get_cosine_with_min_lr_schedule_with_warmup

from pipeline.config.trainer_config import TrainerConfig


def adamw_cosine(parameters: Iterable[nn.Parameter], cfg: TrainerConfig) -> dict:
    """`configure_optimizers` return value: AdamW (no decay on norms/biases) + per-step cosine warmup."""
    decay, no_decay = [], []
    for parameter in parameters:
        if parameter.requires_grad:
            (decay if parameter.ndim >= 2 else no_decay).append(parameter)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.learning_rate,
        betas=(0.9, 0.95),
    )
    # linear warmup, then cosine to 10% of the peak at max_steps
    scheduler = get_cosine_with_min_lr_schedule_with_warmup(optimizer, cfg.warmup_steps, cfg.max_steps,
                                                            min_lr_rate=0.1)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class DrafterModule(LightningModule):
    """What every drafter's LightningModule shares: AdamW + cosine, and the token count kept in checkpoints.

    Subclasses set `self.drafter`, `self.trainer_cfg` and count `self.tokens_seen` in training_step.
    """

    drafter: nn.Module
    trainer_cfg: TrainerConfig
    tokens_seen: int = 0

    def configure_optimizers(self) -> dict:
        return adamw_cosine(self.drafter.parameters(), self.trainer_cfg)

    def log_training(self, loss: torch.Tensor, terms: dict, batch_size: int | None = None) -> None:
        """A training step's loss (on the progress bar), its named terms and the learning rate."""
        self.log("train/loss", loss, prog_bar=True, batch_size=batch_size)
        for name, value in terms.items():
            self.log(f"train/{name}", value, batch_size=batch_size)
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"])

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["draftline_tokens_seen"] = self.tokens_seen

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.tokens_seen = int(checkpoint.get("draftline_tokens_seen", 0))
