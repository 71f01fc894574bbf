"""LightningModule training the DFlash-style block drafter against the frozen verifier.

Every step: one frozen verifier forward (hidden states for the context features, logits for the
labels and the agreement metric; with `cache_verifier_outputs` only on a batch's first visit, the
outputs are kept and reused every later epoch), the anchors (`anchors_per_sequence` per sequence),
and one drafter forward over all blocks of every sequence with the block attention mask
(pipeline/drafters/block/model.py: `block_attention_mask`). Labels are the verifier's own predictions (its
argmax, or its distribution for `fkl`), not the sampled corpus tokens, unless `loss.labels: corpus`.

DSpark variant (`markov_rank` > 0): the loss is taken on the Markov-biased logits, teacher-forced: block
position k's bias comes from the token the verifier produced at anchor + k − 1 (the anchor, then the corpus
response), where drafting feeds the token it just drafted. With `confidence_head`, a BCE term teaches the
head each position's acceptance rate Σ min(p, q) against the verifier's distribution.

Acceptance proxy: block position k "matches" when the drafter's top-1 equals the verifier's top-1 for
the token at anchor + k (teacher-forced on the corpus prefix, which on greedy rows is the verifier's
own continuation and on sampled rows is not: the proxy overstates real acceptance there, hence the
greedy decode of a few validation prompts every validation, `decode_tau`). Position k is accepted iff
positions 1..k all match; `top1_agreement` holds P(k accepted | k−1 accepted) — the same convention as
the AR drafter, so the simulated acceptance length is Σ_k Π_{i≤k} top1_agreement_i — and `position_top1_agreement` the plain
per-position match rate.

Design: docs/algorithms.md#block-drafter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor, nn

from pipeline.config.trainer_config import TrainerConfig
from pipeline.drafters.block.anchors import block_targets, sample_anchors
from pipeline.drafters.block.config import BlockFamilyConfig
from pipeline.drafters.block.decoding import BlockDrafter, BlockProposer
from pipeline.drafters.block.losses import acceptance_rate, block_loss, confidence_loss, position_weights
from pipeline.drafters.block.model import DFlashDraftModel, verifier_parts
from pipeline.training.agreement import DraftAgreement
from pipeline.training.decoded import decode_prompts, decoded_acceptance
from pipeline.training.feature_verifier import OFFLINE_DECODED
from pipeline.training.frozen import VerifierSource
from pipeline.training.module import DrafterModule
from pipeline.training.prompt_response_data import PromptResponseBatches
from pipeline.training.verifier_cache import VerifierOutputCache


def anchor_generator(*key: int) -> torch.Generator:
    """A CPU generator seeded by a tuple (seed, step, rank) / (seed, batch index): reproducible, distinct per key."""
    mixed = 0
    for part in key:
        mixed = (mixed * 1_000_003 + int(part)) % (2**62)
    return torch.Generator().manual_seed(mixed)


@dataclass(frozen=True)
class VerifierTargets:
    """What block training reads from one frozen verifier forward over a batch.

    `hidden_states` is the verifier's `output_hidden_states` tuple with only the drafter's target layers
    kept (the others are None: `fuse_target_hidden` never reads them, and a cached batch then holds a
    fraction of the tuple); `top1` (B, T) its argmax; `logits` (B, T, V) only when the loss needs them (fkl).
    """

    hidden_states: tuple[Tensor | None, ...]
    top1: Tensor
    logits: Tensor | None


def verifier_targets(
    verifier: VerifierSource, batch: dict[str, Tensor], drafter: DFlashDraftModel, cfg: BlockFamilyConfig
) -> VerifierTargets:
    out = verifier.outputs(batch)
    wanted = {layer_id + 1 for layer_id in drafter.config.target_layer_ids}  # index 0 is the embeddings
    hidden = tuple(state if index in wanted else None for index, state in enumerate(out.hidden_states))
    return VerifierTargets(hidden, out.logits.argmax(-1), out.logits if needs_teacher_logits(cfg) else None)


def with_feature_noise(targets: VerifierTargets, half_width: float, generator: torch.Generator) -> VerifierTargets:
    """The target-layer hidden states plus uniform noise in [−w, w] (the peer's `AddUniformNoise`): the drafter
    learns not to lean on exact feature values, which serving's other kernels and dtypes never reproduce."""
    noised = tuple(None if state is None else
                   state + (torch.rand(state.shape, generator=generator, dtype=torch.float32) * 2 - 1)
                   .mul_(half_width).to(state.device, state.dtype)
                   for state in targets.hidden_states)
    return VerifierTargets(noised, targets.top1, targets.logits)


def needs_teacher_logits(cfg: BlockFamilyConfig) -> bool:
    """fkl learns the verifier's distribution; the confidence head's target is the acceptance rate against it."""
    return cfg.loss.fkl > 0 or cfg.confidence_head


def block_signals(
    drafter: DFlashDraftModel, targets: VerifierTargets, batch: dict[str, Tensor], cfg: BlockFamilyConfig,
    weights: Tensor, generator: torch.Generator, embed_tokens: nn.Module, lm_head: nn.Module,
    prompt_anchors: bool = False,
) -> tuple[Tensor, dict[str, Tensor], Tensor, Tensor]:
    """(loss, loss terms, top-1 match (B, N, L−1), label_valid (B, N, L−1)) for one batch of blocks.

    `targets` come from one frozen verifier forward over the batch: the hidden states (context
    features) and the logits the labels come from: block position k is taught the verifier's
    prediction for the token at anchor + k, made at position anchor + k − 1 (on a greedy response,
    exactly the token it would draft there). `prompt_anchors` also anchors blocks inside the prompt
    (from position 1: a block needs some context); validation leaves it off so its numbers stay
    those of response blocks, the only ones serving drafts.
    """
    first = torch.ones_like(batch["prompt_lens"]) if prompt_anchors else batch["prompt_lens"]
    anchors, anchor_valid = sample_anchors(first.cpu(), batch["lengths"].cpu(), cfg.anchors_per_sequence, generator)
    anchors, anchor_valid = anchors.to(batch["input_ids"].device), anchor_valid.to(batch["input_ids"].device)
    block_ids, corpus_labels, label_valid = block_targets(
        batch["input_ids"], batch["lengths"], anchors, anchor_valid, drafter.block_size
    )
    features = drafter.fuse_target_hidden(targets.hidden_states)
    logits, hidden = drafter(features, batch["attention_mask"].bool(), block_ids, anchors, embed_tokens, lm_head,
                             return_hidden=True)
    # DSpark: position k's Markov bias comes from the token before it, teacher-forced to what the verifier
    # produced there (the anchor, then the corpus response); drafting feeds the drafted token instead
    prev_ids = block_ids[..., :-1]
    if drafter.markov_head is not None:
        logits = drafter.markov_logits(logits, prev_ids)
    verifier_top1 = at_block_positions(targets.top1, anchors, drafter.block_size)
    teacher = at_block_positions(targets.logits, anchors, drafter.block_size) if needs_teacher_logits(cfg) else None
    labels = verifier_top1 if cfg.loss.labels == "verifier" else corpus_labels
    trained = label_valid & greedy_chain(corpus_labels, verifier_top1) if cfg.loss.greedy_chain else label_valid
    loss, terms = block_loss(cfg.loss, logits, trained, weights, labels=labels,
                             teacher_logits=teacher if cfg.loss.fkl > 0 else None)
    if drafter.confidence_head is not None:
        # the head learns to read acceptance off the drafter, not to reshape it: hidden states are detached,
        # so it never trades drafting quality for calibration
        confidence = drafter.confidence_logits(hidden.detach(), prev_ids)
        target = acceptance_rate(logits.detach(), teacher, cfg.loss.temperature)
        terms["confidence"] = confidence_loss(confidence, target, trained, weights)
        loss = loss + cfg.loss.confidence * terms["confidence"]
    match = (logits.detach().argmax(-1) == verifier_top1) & label_valid
    return loss, terms, match, label_valid


def greedy_chain(corpus_tokens: Tensor, verifier_top1: Tensor) -> Tensor:
    """(B, N, L−1): position k is on the verifier's greedy chain when the response tokens at anchor+1..anchor+k−1
    are all the verifier's argmax there. Position 1 always is; past that, a sampled token that is not the
    argmax puts the later labels on a path greedy decoding never takes."""
    follows = (corpus_tokens == verifier_top1).long().cumprod(dim=-1).bool()
    return torch.cat([torch.ones_like(follows[..., :1]), follows[..., :-1]], dim=-1)


def at_block_positions(per_position: Tensor, anchors: Tensor, block_size: int) -> Tensor:
    """Values of a (B, T, ...) verifier output where block positions 1..L−1 are predicted: anchor + k − 1.

    Returns (B, N, L−1, ...); positions past T are clamped (their labels are invalid anyway).
    """
    offsets = torch.arange(block_size - 1, device=anchors.device)
    positions = (anchors[..., None] + offsets).clamp(max=per_position.shape[1] - 1)  # (B, N, L−1)
    rows = torch.arange(per_position.shape[0], device=anchors.device)[:, None, None]
    # indexing whole rows: a gather would build a (B, N·(L−1), V) index for the logits
    return per_position[rows, positions]


@torch.no_grad()
def decode_acceptance(
    drafter: DFlashDraftModel, verifier: nn.Module, prompts: Sequence[Sequence[int]], max_new_tokens: int,
    eos_token_id: int | None, denoise_steps: int = 1,
) -> dict:
    """Real acceptance: greedy speculative decoding of `prompts` with this drafter (`decoded_acceptance`)."""
    was_training = drafter.training
    drafter.eval()
    proposer = BlockProposer(BlockDrafter(drafter, verifier, denoise_steps))
    result = decoded_acceptance(proposer, verifier, prompts, max_new_tokens, eos_token_id)
    drafter.train(was_training)
    return result


@torch.no_grad()
def evaluate_blocks(
    drafter: DFlashDraftModel, verifier: VerifierSource, batches: PromptResponseBatches, cfg: BlockFamilyConfig, seed: int,
    max_new_tokens: int = 32, denoise_steps: int = 1,
) -> dict:
    """Loss and teacher-forced acceptance proxy on held-out batches (anchors fixed by (seed, batch index)),
    plus the real greedy-decoding acceptance on a few held-out prompts (None without the full verifier:
    offline, stage `evaluate` measures it)."""
    was_training = drafter.training
    drafter.eval()
    weights = position_weights(drafter.block_size, cfg.gamma)
    agreement, loss_sum, seen = DraftAgreement(drafter.block_size - 1), 0.0, 0
    embed_tokens, lm_head, _, _ = verifier_parts(verifier.head)
    for batch in batches:
        generator = anchor_generator(seed, int(batch["batch_index"]))
        targets = verifier_targets(verifier, batch, drafter, cfg)
        loss, _, match, valid = block_signals(drafter, targets, batch, cfg, weights, generator, embed_tokens, lm_head)
        agreement.add(match, valid)
        loss_sum += loss.item()
        seen += 1
    decoded = OFFLINE_DECODED if verifier.model is None else decode_acceptance(
        drafter, verifier.model, decode_prompts(batches.rows, cfg.decode_prompts), max_new_tokens,
        eos_token_id=verifier.config.eos_token_id, denoise_steps=denoise_steps)
    drafter.train(was_training)
    return {"loss": loss_sum / max(1, seen), **agreement.summary(), **decoded}


class BlockDistillModule(DrafterModule):
    def __init__(self, drafter: DFlashDraftModel, verifier: VerifierSource, cfg: BlockFamilyConfig,
                 trainer_cfg: TrainerConfig, seed: int, val_rows: Sequence[tuple[list[int], int]] = ()):
        super().__init__()
        self.drafter = drafter
        self.verifier = verifier
        self.cfg = cfg
        self.trainer_cfg = trainer_cfg
        self.seed = seed
        self.weights = position_weights(drafter.block_size, cfg.gamma)
        # greedy decoding needs the full verifier: offline it has only the head, and `evaluate` decodes
        self.decode_prompts = decode_prompts(val_rows, cfg.decode_prompts) if verifier.model is not None else []
        self.tokens_seen = 0
        self.last_validation: dict = {}
        # (step, simulated τ, decoded τ) of every validation: the τ-vs-steps curve in training.json
        self.history: list[dict] = []
        self._agreement = DraftAgreement(drafter.block_size - 1)
        # offline the stored features already are the cache
        self._verifier_outputs = VerifierOutputCache(
            lambda batch: verifier_targets(self.verifier, batch, self.drafter, self.cfg),
            cfg.cache_verifier_outputs and verifier.model is not None)

    def verifier_targets(self, batch: dict[str, Tensor], split: str) -> VerifierTargets:
        return self._verifier_outputs(batch, split)

    def on_fit_start(self) -> None:
        self.verifier.to(self.device)

    def training_step(self, batch: dict[str, Tensor], batch_index: int) -> Tensor:
        # Sampled anchors are fresh every step (so every epoch), reproducible across resume and distinct per rank.
        generator = anchor_generator(self.seed, self.global_step, batch_index, self.global_rank)
        targets = self.verifier_targets(batch, "train")
        if self.cfg.feature_noise > 0:
            targets = with_feature_noise(targets, self.cfg.feature_noise, generator)
        loss, terms, _, label_valid = block_signals(self.drafter, targets, batch, self.cfg,
                                                    self.weights, generator, self.embed_tokens, self.lm_head,
                                                    prompt_anchors=self.cfg.prompt_anchors)
        self.tokens_seen += int(label_valid.sum().item())
        self.log_training(loss, terms, batch["input_ids"].shape[0])
        return loss

    def on_validation_epoch_start(self) -> None:
        self.verifier.to(self.device)
        self._agreement = DraftAgreement(self.drafter.block_size - 1)

    def validation_step(self, batch: dict[str, Tensor], batch_index: int) -> None:
        generator = anchor_generator(self.seed, int(batch["batch_index"]))
        loss, _, match, valid = block_signals(self.drafter, self.verifier_targets(batch, "validation"), batch, self.cfg,
                                              self.weights, generator, self.embed_tokens, self.lm_head)
        self._agreement.add(match, valid)
        self.log("val/loss", loss, sync_dist=True, prog_bar=True, batch_size=batch["input_ids"].shape[0])

    def on_validation_epoch_end(self) -> None:
        self._agreement.reduce(self)
        summary = self._agreement.summary()
        for position, rate in enumerate(summary["position_top1_agreement"], start=1):
            self.log(f"val/top1_pos{position}", rate, rank_zero_only=True)
        self.log("val/acceptance_length", summary["simulated_acceptance_length"], rank_zero_only=True, prog_bar=True)
        point = {"step": self.global_step, "simulated_acceptance_length": summary["simulated_acceptance_length"]}
        if self.decode_prompts and self.trainer.is_global_zero:
            decoded = decode_acceptance(self.drafter, self.verifier.model, self.decode_prompts, max_new_tokens=32,
                                        eos_token_id=self.verifier.config.eos_token_id)
            self.log("val/decode_tau", decoded["decode_tau"], rank_zero_only=True, prog_bar=True)
            self.log("val/decode_tau_no_prefill", decoded["decode_tau_no_prefill"], rank_zero_only=True)
            for position, rate in enumerate(decoded["decode_acceptance"], start=1):
                self.log(f"val/decode_accept_pos{position}", rate, rank_zero_only=True)
            summary.update(decoded)
            point.update(decode_tau=decoded["decode_tau"], decode_tau_no_prefill=decoded["decode_tau_no_prefill"])
        self.history.append(point)
        self.last_validation = summary

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["draftline_block_history"] = self.history

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self.history = list(checkpoint.get("draftline_block_history", []))
