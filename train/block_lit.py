"""LightningModule training the DFlash-style block drafter against the frozen verifier.

Every step: one frozen verifier forward (hidden states for the context features, logits for the
agreement metric), fresh random anchors, and one drafter forward over all blocks of every sequence
with the block attention mask (train/block_model.py: `training_attention_mask`).

Acceptance proxy: block position k "matches" when the drafter's top-1 equals the verifier's top-1 for
the token at anchor + k (teacher-forced on the corpus prefix, which on a greedy corpus is the
verifier's own continuation). Position k is accepted iff positions 1..k all match; `top1_agreement`
holds P(k accepted | k−1 accepted) — the same convention as the AR drafter, so the simulated
acceptance length is Σ_k Π_{i≤k} top1_agreement_i — and `position_top1_agreement` the plain
per-position match rate.
"""

from __future__ import annotations

from typing import Iterable

import torch
from lightning.pytorch import LightningModule
from torch import Tensor, nn

from pipeline.config import BlockDrafterConfig, TrainerConfig
from pipeline.errors import DraftlineError
from train.block_data import block_targets, sample_anchors
from train.block_model import (
    DFlashConfig,
    DFlashDraftModel,
    block_loss,
    build_target_layer_ids,
    position_weights,
    verifier_parts,
)
from train.frozen import FrozenVerifier
from train.trainer import AcceptanceTally, DrafterModule, simulated_acceptance_length


def drafter_config(verifier: nn.Module, cfg: BlockDrafterConfig, mask_token_id: int | None) -> DFlashConfig:
    """The DFlash config for `verifier` from params: width, vocabulary and RoPE base follow the verifier."""
    text = verifier.config.get_text_config()
    _, _, depth, hidden = verifier_parts(verifier)
    if cfg.mask == "token" and mask_token_id is None:
        raise DraftlineError("train.block.mask is 'token' but the verifier's tokenizer has no mask token; "
                             "set train.block.mask to 'auto' or 'learned'")
    mask_mode = "learned" if cfg.mask == "learned" or mask_token_id is None else "token"
    layer_ids = cfg.target_layer_ids or build_target_layer_ids(depth, cfg.num_target_layers)
    if any(not 0 <= layer_id < depth for layer_id in layer_ids):
        raise DraftlineError(f"train.block.target_layer_ids {layer_ids} out of range for a {depth}-layer verifier; "
                             f"use ids in 0..{depth - 1} or null for the default spread")
    heads = cfg.num_heads or int(text.num_attention_heads)
    kv_heads = cfg.num_kv_heads or int(getattr(text, "num_key_value_heads", None) or heads)
    if heads % kv_heads:
        raise DraftlineError(f"train.block.num_heads ({heads}) must be a multiple of num_kv_heads ({kv_heads})")
    verifier_head_dim = getattr(text, "head_dim", None) or hidden // int(text.num_attention_heads)
    head_dim = int(verifier_head_dim) if cfg.num_heads is None else hidden // heads
    rope = getattr(text, "rope_parameters", None) or {}
    return DFlashConfig(
        hidden_size=hidden,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=cfg.intermediate_size or int(text.intermediate_size),
        rms_norm_eps=float(getattr(text, "rms_norm_eps", 1e-6)),
        rope_theta=float(rope.get("rope_theta", getattr(text, "rope_theta", 10_000.0))),
        max_position_embeddings=int(getattr(text, "max_position_embeddings", 4096)),
        vocab_size=int(text.vocab_size),
        block_size=cfg.block_size,
        num_target_layers=depth,
        dflash_config={"mask_token_id": mask_token_id if mask_mode == "token" else None, "target_layer_ids": layer_ids},
        mask_mode=mask_mode,
        eos_token_id=getattr(text, "eos_token_id", None),
        pad_token_id=getattr(text, "pad_token_id", None),
    )


def build_block_drafter(verifier: nn.Module, cfg: BlockDrafterConfig, mask_token_id: int | None, seed: int) -> DFlashDraftModel:
    torch.manual_seed(seed)
    return DFlashDraftModel(drafter_config(verifier, cfg, mask_token_id))


def anchor_generator(*key: int) -> torch.Generator:
    """A CPU generator seeded by a tuple (seed, step, rank) / (seed, batch index): reproducible, distinct per key."""
    mixed = 0
    for part in key:
        mixed = (mixed * 1_000_003 + int(part)) % (2**62)
    return torch.Generator().manual_seed(mixed)


def block_signals(
    drafter: DFlashDraftModel, verifier: FrozenVerifier, batch: dict[str, Tensor], anchors_per_sequence: int,
    weights: Tensor, generator: torch.Generator, need_match: bool = True,
) -> tuple[Tensor, Tensor | None, Tensor]:
    """(loss, top-1 match (B, N, L−1) or None, label_valid (B, N, L−1)) for one batch with freshly drawn anchors."""
    # logits_to_keep=1: the verifier's full-sequence logits are never needed, only its hidden states.
    out = verifier(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   output_hidden_states=True, logits_to_keep=1)
    embed_tokens, lm_head, _, _ = verifier_parts(verifier.model)
    anchors, anchor_valid = sample_anchors(batch["prompt_lens"].cpu(), batch["lengths"].cpu(), anchors_per_sequence, generator)
    anchors, anchor_valid = anchors.to(batch["input_ids"].device), anchor_valid.to(batch["input_ids"].device)
    block_ids, labels, label_valid = block_targets(
        batch["input_ids"], batch["lengths"], anchors, anchor_valid, drafter.block_size
    )
    features = drafter.fuse_target_hidden(out.hidden_states)
    logits = drafter(features, batch["attention_mask"].bool(), block_ids, anchors, embed_tokens, lm_head)
    loss = block_loss(logits, labels, label_valid, weights)
    if not need_match:
        return loss, None, label_valid
    match = (logits.argmax(-1) == verifier_top1(out.hidden_states[-1], lm_head, anchors, drafter.block_size)) & label_valid
    return loss, match, label_valid


@torch.no_grad()
def verifier_top1(last_hidden: Tensor, lm_head: nn.Module, anchors: Tensor, block_size: int) -> Tensor:
    """The verifier's top-1 for the tokens at anchor + 1..L−1 (B, N, L−1), from its final hidden state
    (HF decoders return it after the final norm: exactly what the LM head reads; soft-capping keeps the argmax)."""
    offsets = torch.arange(block_size - 1, device=anchors.device)
    # The token at anchor + k is predicted at position anchor + k − 1.
    positions = (anchors[..., None] + offsets).clamp(max=last_hidden.shape[1] - 1)
    picked = torch.gather(last_hidden, 1, positions.flatten(1)[..., None].expand(-1, -1, last_hidden.shape[-1]))
    return lm_head(picked).argmax(-1).view_as(positions)


class BlockAgreement:
    """Accumulates per-position matches of validation blocks into the acceptance proxy."""

    def __init__(self, positions: int):
        self.tally = AcceptanceTally(positions)
        self.matched = torch.zeros(positions, dtype=torch.float64)
        self.counted = torch.zeros(positions, dtype=torch.float64)

    def add(self, match: Tensor, label_valid: Tensor) -> None:
        match, valid = match.flatten(0, 1), label_valid.flatten(0, 1)
        accepted = match.long().cumprod(dim=1).bool()
        reached = torch.cat([torch.ones_like(accepted[:, :1]), accepted[:, :-1]], dim=1) & valid
        self.tally.add(accepted.sum(0), reached.sum(0))
        self.matched += match.sum(0).to("cpu", torch.float64)
        self.counted += valid.sum(0).to("cpu", torch.float64)

    def reduce(self, module: LightningModule) -> None:
        self.tally.reduce(module)
        if module.trainer is not None and module.trainer.world_size > 1:
            self.matched = module.all_gather(self.matched.to(module.device)).reshape(-1, self.matched.numel()).sum(0).cpu()
            self.counted = module.all_gather(self.counted.to(module.device)).reshape(-1, self.counted.numel()).sum(0).cpu()

    def summary(self) -> dict:
        rates = self.tally.rates()
        per_position = [float(m / c) if c > 0 else 0.0 for m, c in zip(self.matched, self.counted)]
        return {
            "top1_agreement": rates,
            "position_top1_agreement": per_position,
            "simulated_acceptance_length": simulated_acceptance_length(rates),
        }


@torch.no_grad()
def evaluate_blocks(
    drafter: DFlashDraftModel, verifier: FrozenVerifier, batches: Iterable[dict[str, Tensor]],
    cfg: BlockDrafterConfig, seed: int,
) -> dict:
    """Loss and acceptance proxy on held-out batches with anchors fixed by (seed, batch index)."""
    was_training = drafter.training
    drafter.eval()
    weights = position_weights(drafter.block_size, cfg.gamma)
    agreement, loss_sum, seen = BlockAgreement(drafter.block_size - 1), 0.0, 0
    for batch in batches:
        generator = anchor_generator(seed, int(batch["batch_index"]))
        loss, match, valid = block_signals(drafter, verifier, batch, cfg.anchors_per_sequence, weights, generator)
        agreement.add(match, valid)
        loss_sum += loss.item()
        seen += 1
    drafter.train(was_training)
    return {"loss": loss_sum / max(1, seen), **agreement.summary()}


class BlockDistillModule(DrafterModule):
    def __init__(self, drafter: DFlashDraftModel, verifier: nn.Module, cfg: BlockDrafterConfig,
                 trainer_cfg: TrainerConfig, seed: int):
        super().__init__()
        self.drafter = drafter
        # A plain attribute, not a submodule: out of the optimizer, checkpoints, DDP and ZeRO-3.
        self.verifier = FrozenVerifier(verifier)
        self.cfg = cfg
        self.trainer_cfg = trainer_cfg
        self.seed = seed
        self.weights = position_weights(drafter.block_size, cfg.gamma)
        self.tokens_seen = 0
        self.last_validation: dict = {}
        self._agreement = BlockAgreement(drafter.block_size - 1)

    def on_fit_start(self) -> None:
        self.verifier.to(self.device)

    def training_step(self, batch: dict[str, Tensor], batch_index: int) -> Tensor:
        # Fresh anchors every step (so every epoch), reproducible across resume and distinct per rank.
        generator = anchor_generator(self.seed, self.global_step, batch_index, self.global_rank)
        loss, _, label_valid = block_signals(
            self.drafter, self.verifier, batch, self.cfg.anchors_per_sequence, self.weights, generator, need_match=False
        )
        self.tokens_seen += int(label_valid.sum().item())
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0])
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return loss

    def on_validation_epoch_start(self) -> None:
        self.verifier.to(self.device)
        self._agreement = BlockAgreement(self.drafter.block_size - 1)

    def validation_step(self, batch: dict[str, Tensor], batch_index: int) -> None:
        generator = anchor_generator(self.seed, int(batch["batch_index"]))
        loss, match, valid = block_signals(
            self.drafter, self.verifier, batch, self.cfg.anchors_per_sequence, self.weights, generator
        )
        self._agreement.add(match, valid)
        self.log("val/loss", loss, sync_dist=True, prog_bar=True, batch_size=batch["input_ids"].shape[0])

    def on_validation_epoch_end(self) -> None:
        self._agreement.reduce(self)
        summary = self._agreement.summary()
        for position, rate in enumerate(summary["position_top1_agreement"], start=1):
            self.log(f"val/top1_pos{position}", rate, rank_zero_only=True)
        self.log("val/acceptance_length", summary["simulated_acceptance_length"], rank_zero_only=True, prog_bar=True)
        self.last_validation = summary
