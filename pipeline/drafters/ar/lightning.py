"""LightningModule distilling the AR drafter from the frozen verifier.

Acceptance proxy (teacher-forced): at every response prediction position t, `match[t]` says whether
the drafter's top-1 equals the verifier's top-1 given the corpus prefix. A k-token draft starting at
s accepts position i iff match[s..s+i] all hold; since every earlier draft matched the verifier's
argmax, the prefix the drafter sees equals the verifier's greedy continuation, which *is* the corpus
response on rows generated greedily (`corpus.greedy_share` of them, or all at `corpus.sampling`
temperature 0). So on greedy rows this equals free-running k-token drafting at every start position;
on sampled rows it is the teacher-forced approximation. All start positions are used (no sampling noise).
"""

from __future__ import annotations

from typing import Iterable

import torch
from transformers import PreTrainedModel

from pipeline.config.trainer_config import LossConfig, TrainerConfig
from pipeline.training.agreement import AgreementCounts, simulated_acceptance_length
from pipeline.training.distillation import mixture, needs_teacher
from pipeline.training.frozen import VerifierSource, response_logits
from pipeline.training.module import DrafterModule


def batch_signals(
    drafter: torch.nn.Module, verifier: VerifierSource, batch: dict[str, torch.Tensor], loss_cfg: LossConfig,
    need_teacher: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor | None]:
    """(loss, loss terms, top-1 match (B, T), False off the response, or None without the teacher)."""
    mask = batch["loss_mask"]
    student = response_logits(drafter, batch)
    teacher = verifier.response_logits(batch) if need_teacher else None
    labels = batch["labels"][mask].unsqueeze(0)
    flat_mask = torch.ones_like(labels, dtype=torch.bool)
    loss, terms = mixture(loss_cfg, student, flat_mask, labels=labels, teacher_logits=teacher)
    match = None
    if teacher is not None:
        match = torch.zeros_like(mask)
        match[mask] = student[0].argmax(-1) == teacher[0].argmax(-1)
    return loss, terms, match


def agreement_summary(tally: AgreementCounts, matched: float, counted: float) -> dict:
    rates = tally.rates()
    return {
        "top1_agreement": rates,
        "simulated_acceptance_length": simulated_acceptance_length(rates),
        "token_top1_agreement": matched / counted if counted else 0.0,
    }


@torch.no_grad()
def evaluate_agreement(
    drafter: PreTrainedModel, verifier: VerifierSource, batches: Iterable[dict[str, torch.Tensor]],
    loss_cfg: LossConfig, draft_tokens: int,
) -> dict:
    """Loss and acceptance proxy of `drafter` on held-out batches, outside Lightning (any process)."""
    was_training = drafter.training
    drafter.eval()
    device = next(drafter.parameters()).device
    verifier.to(device)
    tally, matched, counted, loss_sum, batches_seen = AgreementCounts(draft_tokens), 0.0, 0.0, 0.0, 0
    for batch in batches:
        batch = {name: tensor.to(device) for name, tensor in batch.items()}
        loss, _, match = batch_signals(drafter, verifier, batch, loss_cfg)
        tally.add_windows(match, batch["loss_mask"])
        matched += (match & batch["loss_mask"]).sum().item()
        counted += batch["loss_mask"].sum().item()
        loss_sum += loss.item()
        batches_seen += 1
    drafter.train(was_training)
    return {"loss": loss_sum / max(1, batches_seen), **agreement_summary(tally, matched, counted)}


class ARDistillModule(DrafterModule):
    def __init__(
        self, drafter: PreTrainedModel, verifier: VerifierSource, loss_cfg: LossConfig,
        trainer_cfg: TrainerConfig, draft_tokens: int,
    ):
        super().__init__()
        self.drafter = drafter
        self.verifier = verifier
        self.loss_cfg = loss_cfg
        self.trainer_cfg = trainer_cfg
        self.draft_tokens = draft_tokens
        self.tokens_seen = 0
        self._tally = AgreementCounts(draft_tokens)
        self._match_counts = torch.zeros(2, dtype=torch.float64)

    def on_fit_start(self) -> None:
        self.verifier.to(self.device)

    def training_step(self, batch: dict[str, torch.Tensor], batch_index: int) -> torch.Tensor:
        loss, terms, _ = batch_signals(self.drafter, self.verifier, batch, self.loss_cfg,
                                       need_teacher=needs_teacher(self.loss_cfg))
        self.tokens_seen += int(batch["loss_mask"].sum().item())
        self.log_training(loss, terms)
        return loss

    def on_validation_epoch_start(self) -> None:
        self.verifier.to(self.device)
        self._tally = AgreementCounts(self.draft_tokens)
        self._match_counts = torch.zeros(2, dtype=torch.float64)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_index: int) -> None:
        loss, _, match = batch_signals(self.drafter, self.verifier, batch, self.loss_cfg)
        self._tally.add_windows(match, batch["loss_mask"])
        self._match_counts += torch.tensor(
            [(match & batch["loss_mask"]).sum().item(), batch["loss_mask"].sum().item()], dtype=torch.float64
        )
        self.log("val/loss", loss, sync_dist=True, prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        self._tally.reduce(self)
        counts = self._match_counts
        if self.trainer.world_size > 1:
            counts = self.all_gather(counts.to(self.device)).reshape(-1, 2).sum(0).cpu()
        summary = agreement_summary(self._tally, counts[0].item(), counts[1].item())
        for position, rate in enumerate(summary["top1_agreement"], start=1):
            self.log(f"val/top1_pos{position}", rate, rank_zero_only=True)
        self.log("val/acceptance_length", summary["simulated_acceptance_length"], rank_zero_only=True, prog_bar=True)
        self.log("val/top1_agreement", summary["token_top1_agreement"], rank_zero_only=True)
