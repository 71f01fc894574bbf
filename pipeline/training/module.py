"""The base of every kind's LightningModule: its optimizer (AdamW, or Muon + AdamW) with a warm-up schedule,
and the token count kept in checkpoints."""

from __future__ import annotations

from typing import Iterable

import torch
from lightning.pytorch import LightningModule
from torch import nn
from transformers import get_cosine_with_min_lr_schedule_with_warmup, get_linear_schedule_with_warmup

from pipeline.config.trainer_config import TrainerConfig
from pipeline.progress import info
from pipeline.training.frozen import VerifierSource
from pipeline.training.muon import MuonAdamW, split_for_muon


def build_optimizer(named_parameters: Iterable[tuple[str, nn.Parameter]], cfg: TrainerConfig) -> dict:
    """`configure_optimizers` return value: `cfg.optimizer` (no decay on norms/biases) + per-step warm-up,
    then `cfg.lr_schedule`."""
    named = [(name, parameter) for name, parameter in named_parameters if parameter.requires_grad]
    if cfg.optimizer == "muon":
        optimizer = MuonAdamW(*split_for_muon(named), lr=cfg.learning_rate, weight_decay=cfg.weight_decay,
                              precision=cfg.muon_precision)
    else:
        decay = [parameter for _, parameter in named if parameter.ndim >= 2]
        no_decay = [parameter for _, parameter in named if parameter.ndim < 2]
        groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        if cfg.offload_optimizer:
            # ZeRO-Offload refuses a torch optimizer (ZeRORuntimeException): its states live on the CPU, where
            # DeepSpeed's own AdamW kernel runs; DeepSpeed compiles it on first use on a machine (then cached)
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            info("offload_optimizer: DeepSpeed compiles its CPU Adam on the first use on a machine (measured: 85 s on 2 "
                 "cores), then loads it from its cache")
            optimizer = DeepSpeedCPUAdam(groups, lr=cfg.learning_rate, betas=(0.9, 0.95), adamw_mode=True)
        else:
            optimizer = torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(0.9, 0.95))
    if cfg.lr_schedule == "linear":  # linear warm-up, then linearly to 0 at max_steps
        scheduler = get_linear_schedule_with_warmup(optimizer, cfg.warmup_steps, cfg.max_steps)
    else:  # linear warm-up, then cosine to 10% of the peak at max_steps
        scheduler = get_cosine_with_min_lr_schedule_with_warmup(optimizer, cfg.warmup_steps, cfg.max_steps,
                                                                min_lr_rate=0.1)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class DrafterModule(LightningModule):
    """What every drafter's LightningModule shares: its optimizer and schedule, and the token count kept in
    checkpoints.

    Subclasses set `self.drafter`, `self.verifier`, `self.trainer_cfg` and count `self.tokens_seen` in
    training_step.
    """

    drafter: nn.Module
    verifier: VerifierSource  # a plain attribute, not a submodule: out of the optimizer, checkpoints, DDP and ZeRO-3
    trainer_cfg: TrainerConfig
    tokens_seen: int = 0

    # The verifier's embedding and head are read through it, never kept as attributes here: those would be
    # submodules, ZeRO-3 would partition them, and after training rank 0 alone could not evaluate the gathered
    # drafter with them (it would wait for its peers' shards).
    @property
    def embed_tokens(self) -> nn.Module:
        return self.verifier.head.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Module:
        return self.verifier.head.get_output_embeddings()

    def configure_optimizers(self) -> dict:
        return build_optimizer(self.drafter.named_parameters(), self.trainer_cfg)

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
