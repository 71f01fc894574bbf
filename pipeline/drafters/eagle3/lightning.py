"""LightningModule training the EAGLE-3 head against the frozen verifier.

Every step: one frozen verifier forward (aux hidden states, argmax, and the logits on the draft
vocabulary for `fkl`; with `cache_verifier_outputs` only on a batch's first visit), then the head
unrolled for `ttt_steps` (training-time test: step j starts from the head's own step j−1 states, see
`Eagle3DraftModel.forward`). Step j at index t predicts the token at t+j+2 and is taught the
verifier's distribution at t+j+1, weighted decay**j.

Acceptance proxy: a draft at index t accepts step j when steps 0..j all match the verifier's top-1
(teacher-forced tokens, the head's own states), the same chain convention as the other drafters.

Design: docs/algorithms.md#eagle3-head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor, nn

from pipeline.config.trainer_config import TrainerConfig
from pipeline.drafters.eagle3.config import Eagle3DrafterConfig
from pipeline.drafters.eagle3.decoding import Eagle3Proposer, TorchEagle3Head
from pipeline.drafters.eagle3.model import Eagle3DraftModel, shift_left
from pipeline.training.agreement import DraftAgreement
from pipeline.training.decoded import decode_prompts, decoded_acceptance
from pipeline.training.distillation import ce, fkl
from pipeline.training.feature_verifier import OFFLINE_DECODED
from pipeline.training.frozen import VerifierSource
from pipeline.training.module import DrafterModule
from pipeline.training.prompt_response_data import PromptResponseBatches
from pipeline.training.verifier_cache import VerifierOutputCache


@dataclass(frozen=True)
class Eagle3Targets:
    """What EAGLE-3 training reads from one frozen verifier forward: the concatenated aux hidden states
    (B, T, n·D), the argmax (B, T) and, for `fkl`, the logits on the draft vocabulary (B, T, V_d)."""

    aux_hidden: Tensor
    top1: Tensor
    logits: Tensor | None


def verifier_targets(verifier: VerifierSource, batch: dict[str, Tensor], drafter: Eagle3DraftModel,
                     cfg: Eagle3DrafterConfig) -> Eagle3Targets:
    out = verifier.outputs(batch)
    logits = None
    if cfg.loss.fkl > 0:
        ids = drafter.draft_ids
        logits = out.logits if ids is None else out.logits[..., ids]
    return Eagle3Targets(drafter.aux_hidden(out.hidden_states), out.logits.argmax(-1), logits)


def ttt_signals(drafter: Eagle3DraftModel, targets: Eagle3Targets, batch: dict[str, Tensor],
                cfg: Eagle3DrafterConfig, embed_tokens: nn.Module, prompt_positions: bool = False,
                ) -> tuple[Tensor, dict[str, Tensor], Tensor, Tensor]:
    """(loss, loss terms, top-1 match (B, T, steps), label valid (B, T, steps)) for one batch.

    Labels are valid where the predicted token lies inside the sequence and, unless
    `prompt_positions`, in the response (the only tokens serving drafts).
    """
    input_ids, lengths = batch["input_ids"], batch["lengths"]
    total = input_ids.shape[1]
    first = torch.zeros_like(batch["prompt_lens"]) if prompt_positions else batch["prompt_lens"]
    index = torch.arange(total, device=input_ids.device)[None]
    step_logits = drafter(targets.aux_hidden, input_ids, batch["attention_mask"], embed_tokens, cfg.ttt_steps)
    draft_ids = drafter.draft_ids
    loss = input_ids.new_zeros((), dtype=torch.float32)
    terms: dict[str, Tensor] = {}
    matches, valids = [], []
    for step, logits in enumerate(step_logits):
        predicted = index + step + 2  # the token this step drafts
        valid = (predicted < lengths[:, None]) & (predicted >= first[:, None])
        top1 = shift_left(targets.top1, step + 1)  # the verifier's argmax for that token
        step_loss = logits.new_zeros((), dtype=torch.float32)
        if cfg.loss.fkl > 0:
            term = fkl(logits, shift_left_values(targets.logits, step + 1), valid, cfg.loss.temperature)
            terms[f"fkl_step{step}"] = term.detach()
            step_loss = step_loss + cfg.loss.fkl * term
        if cfg.loss.ce > 0:
            labels, in_vocab = to_draft_ids(drafter, top1)
            term = ce(logits, labels, valid & in_vocab)
            terms[f"ce_step{step}"] = term.detach()
            step_loss = step_loss + cfg.loss.ce * term
        loss = loss + cfg.loss.decay ** step * step_loss
        guess = logits.detach().argmax(-1)
        matches.append(((guess if draft_ids is None else draft_ids[guess]) == top1) & valid)
        valids.append(valid)
    return loss, terms, torch.stack(matches, dim=-1), torch.stack(valids, dim=-1)


def shift_left_values(values: Tensor, by: int) -> Tensor:
    """(B, T, V) -> the row `by` positions later at every index (zeros past the end; masked there)."""
    return torch.cat([values[:, by:], torch.zeros_like(values[:, :by])], dim=1)


def to_draft_ids(drafter: Eagle3DraftModel, verifier_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Verifier ids -> (draft ids, whether the id is in the draft vocabulary)."""
    if drafter.draft_ids is None:
        return verifier_ids, torch.ones_like(verifier_ids, dtype=torch.bool)
    in_vocab = drafter.t2d[verifier_ids]
    rank = drafter.t2d.long().cumsum(0) - 1  # draft id of every verifier id in the draft vocabulary
    return torch.where(in_vocab, rank[verifier_ids], torch.zeros_like(verifier_ids)), in_vocab


@torch.no_grad()
def decode_acceptance(drafter: Eagle3DraftModel, verifier: nn.Module, prompts: Sequence[Sequence[int]],
                      draft_tokens: int, max_new_tokens: int = 32) -> dict:
    was_training = drafter.training
    drafter.eval()
    proposer = Eagle3Proposer(TorchEagle3Head(drafter, verifier), draft_tokens)
    result = decoded_acceptance(proposer, verifier, prompts, max_new_tokens,
                                eos_token_id=verifier.config.eos_token_id)
    drafter.train(was_training)
    return result


@torch.no_grad()
def evaluate_head(drafter: Eagle3DraftModel, verifier: VerifierSource, batches: PromptResponseBatches,
                  cfg: Eagle3DrafterConfig) -> dict:
    """Loss and teacher-forced acceptance proxy on held-out batches, plus the real greedy-decoding
    acceptance on a few held-out prompts (None without the full verifier: offline, stage `evaluate` measures it)."""
    was_training = drafter.training
    drafter.eval()
    agreement, loss_sum, seen = DraftAgreement(cfg.ttt_steps), 0.0, 0
    embed_tokens = verifier.head.get_input_embeddings()
    for batch in batches:
        loss, _, match, valid = ttt_signals(drafter, verifier_targets(verifier, batch, drafter, cfg), batch, cfg,
                                            embed_tokens)
        agreement.add(match, valid)
        loss_sum += loss.item()
        seen += 1
    decoded = OFFLINE_DECODED if verifier.model is None else decode_acceptance(
        drafter, verifier.model, decode_prompts(batches.rows, cfg.decode_prompts), cfg.draft_tokens)
    drafter.train(was_training)
    return {"loss": loss_sum / max(1, seen), **agreement.summary(), **decoded}


class Eagle3DistillModule(DrafterModule):
    def __init__(self, drafter: Eagle3DraftModel, verifier: VerifierSource, cfg: Eagle3DrafterConfig,
                 trainer_cfg: TrainerConfig, val_rows: Sequence[tuple[list[int], int]] = ()):
        super().__init__()
        self.drafter = drafter
        self.verifier = verifier
        self.cfg = cfg
        self.trainer_cfg = trainer_cfg
        # greedy decoding needs the full verifier: offline it has only the head, and `evaluate` decodes
        self.decode_prompts = decode_prompts(val_rows, cfg.decode_prompts) if verifier.model is not None else []
        self.tokens_seen = 0
        self.last_validation: dict = {}
        self._agreement = DraftAgreement(cfg.ttt_steps)
        # offline the stored features already are the cache
        self._verifier_outputs = VerifierOutputCache(
            lambda batch: verifier_targets(self.verifier, batch, self.drafter, self.cfg),
            cfg.cache_verifier_outputs and verifier.model is not None)

    def on_fit_start(self) -> None:
        self.verifier.to(self.device)

    def training_step(self, batch: dict[str, Tensor], batch_index: int) -> Tensor:
        loss, terms, _, valid = ttt_signals(self.drafter, self._verifier_outputs(batch, "train"), batch, self.cfg,
                                            self.embed_tokens, prompt_positions=self.cfg.prompt_positions)
        self.tokens_seen += int(valid[..., 0].sum().item())
        self.log_training(loss, terms, batch["input_ids"].shape[0])
        return loss

    def on_validation_epoch_start(self) -> None:
        self.verifier.to(self.device)
        self._agreement = DraftAgreement(self.cfg.ttt_steps)

    def validation_step(self, batch: dict[str, Tensor], batch_index: int) -> None:
        loss, _, match, valid = ttt_signals(self.drafter, self._verifier_outputs(batch, "validation"), batch,
                                            self.cfg, self.embed_tokens)
        self._agreement.add(match, valid)
        self.log("val/loss", loss, sync_dist=True, prog_bar=True, batch_size=batch["input_ids"].shape[0])

    def on_validation_epoch_end(self) -> None:
        self._agreement.reduce(self)
        summary = self._agreement.summary()
        for step, rate in enumerate(summary["position_top1_agreement"], start=1):
            self.log(f"val/top1_pos{step}", rate, rank_zero_only=True)
        self.log("val/acceptance_length", summary["simulated_acceptance_length"], rank_zero_only=True, prog_bar=True)
        if self.decode_prompts and self.trainer.is_global_zero:
            decoded = decode_acceptance(self.drafter, self.verifier.model, self.decode_prompts, self.cfg.draft_tokens)
            self.log("val/decode_tau", decoded["decode_tau"], rank_zero_only=True, prog_bar=True)
            summary.update(decoded)
        self.last_validation = summary
