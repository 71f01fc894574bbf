"""The DFlash-style block-diffusion drafter (docs/algorithms.md#block-drafter; arXiv 2602.06036, z-lab/dflash).

A block `[anchor, MASK × (B−1)]` is embedded with the verifier's frozen embeddings and run through a
few Qwen3-style layers whose keys/values are `[proj(context features); proj(block)]`: the context
features are the fused hidden states of selected verifier layers at the committed positions before
the anchor, queries come only from the block, attention inside the block is bidirectional (or causal:
`train.block.attention`, saved as `dflash_config.causal`), RoPE uses absolute positions. Position k of
the block predicts the token at anchor + k (no shift), read through `norm` and the verifier's frozen
LM head.

Weight names follow z-lab/dflash (`layers.*`, `fc`, `hidden_norm`, `norm`; no embedding or LM head),
which is what vLLM `method: dflash`, SGLang `DFLASH` and TensorRT-LLM `DFlashDecodingConfig` load.
As upstream, the context features enter each layer's k/v projections directly (they are already
normalised by `hidden_norm`); only the block goes through `input_layernorm`.

The DSpark kind (`train.dspark`, `markov_rank` > 0; arXiv DSpark, vLLM `qwen3_dspark.py`) is this same
drafter plus a **Markov head**: `markov_w1` (V × r embedding) of the previous block token, projected by
`markov_w2` (r × V) to a bias added to the position's logits. The parallel pass is unchanged; the bias
makes position k depend on the token drafted at k − 1, so drafting runs left to right through the head
(`markov_logits`), at every temperature. Training teacher-forces it: the previous token is the one the
verifier produced in the corpus at anchor + k − 1 (the anchor for k = 1). An optional **confidence
head** (`proj` over [block hidden state; Markov embedding]) estimates each position's acceptance, so
decoding may cut a block short. Weight names are vLLM's (`markov_head.markov_w{1,2}`,
`confidence_head.proj`); the export writes them under `architectures: ["Qwen3DSparkModel"]`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm

from pipeline.drafters.block.config import BlockFamilyConfig, build_target_layer_ids, target_layer_ids
from pipeline.drafters.rope import apply_rope, rope_cos_sin
from pipeline.errors import DraftlineError
from pipeline.integrity import load_pretrained, require_checkpoint

MASK_MODES = ("token", "learned")


class DFlashConfig(PretrainedConfig):
    model_type = "dflash"

    def __init__(
        self,
        hidden_size: int = 128,
        num_hidden_layers: int = 1,
        num_attention_heads: int = 4,
        num_key_value_heads: int = 2,
        head_dim: int = 32,
        intermediate_size: int = 384,
        hidden_act: str = "silu",
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 1_000_000.0,
        max_position_embeddings: int = 4096,
        vocab_size: int = 4096,
        block_size: int = 8,
        num_target_layers: int = 4,
        dflash_config: dict | None = None,
        mask_mode: str = "token",
        mask_rule: str | None = None,
        initializer_range: float = 0.02,
        attention_bias: bool = False,
        markov_rank: int = 0,
        enable_confidence_head: bool = False,
        **kwargs,
    ):
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        # transformers 5 / TensorRT-LLM read RoPE from here; rope_theta stays for older readers.
        self.rope_parameters = {"rope_type": "default", "rope_theta": rope_theta}
        self.max_position_embeddings = max_position_embeddings
        self.vocab_size = vocab_size
        self.block_size = block_size
        # Depth of the *verifier* (what serving stacks read), not the number of selected layers.
        self.num_target_layers = num_target_layers
        dflash_config = dict(dflash_config or {})
        dflash_config.setdefault("target_layer_ids", build_target_layer_ids(num_target_layers, 1))
        dflash_config.setdefault("mask_token_id", None)
        dflash_config.setdefault("causal", False)
        dflash_config["block_size"] = block_size
        self.dflash_config = dflash_config
        if mask_mode not in MASK_MODES:
            raise ValueError(f"mask_mode must be one of {MASK_MODES}, got {mask_mode!r}")
        if mask_mode == "token" and dflash_config["mask_token_id"] is None:
            raise ValueError("mask_mode 'token' needs dflash_config.mask_token_id")
        self.mask_mode = mask_mode
        self.mask_rule = mask_rule  # why this mask id (kept in config.json, shown in launch.md)
        self.initializer_range = initializer_range
        self.attention_bias = attention_bias
        if markov_rank < 0 or (enable_confidence_head and markov_rank == 0):
            raise ValueError(f"markov_rank must be >= 0 and > 0 with a confidence head, got {markov_rank}")
        self.markov_rank = int(markov_rank)
        self.enable_confidence_head = bool(enable_confidence_head)
        # vLLM's key: the confidence head reads [hidden; Markov embedding] (always, here: it needs the head)
        self.confidence_head_with_markov = self.enable_confidence_head
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)

    @property
    def target_layer_ids(self) -> list[int]:
        return list(self.dflash_config["target_layer_ids"])

    @property
    def mask_token_id(self) -> int | None:
        return self.dflash_config["mask_token_id"]

    @property
    def causal(self) -> bool:
        """Attention inside the block: False (DFlash) sees the whole block, True the anchor and earlier positions."""
        return bool(self.dflash_config["causal"])

    @property
    def is_dspark(self) -> bool:
        """The DSpark variant: a Markov head (and maybe a confidence head) on the DFlash pass."""
        return self.markov_rank > 0


# --------------------------------------------------------------------------- layers


class DFlashAttention(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.head_dim = config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def _heads(self, x: Tensor, heads: int) -> Tensor:
        return x.view(*x.shape[:2], heads, self.head_dim).transpose(1, 2)

    def key_value(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """(B, T, D) with the rotary (cos, sin) of its absolute positions (`rope_cos_sin`) -> roped, normed keys
        and values (B, H_kv, T, head_dim)."""
        keys = apply_rope(self.k_norm(self._heads(self.k_proj(x), self.num_kv_heads)), *rope)
        return keys, self._heads(self.v_proj(x), self.num_kv_heads)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], context_kv: tuple[Tensor, Tensor],
                mask: Tensor | None) -> Tensor:
        """Block queries (B, Q, D) over keys [context; block]; `mask` (B, 1, Q, T_ctx + Q) bool, True = visible,
        or None where every key is visible."""
        queries = apply_rope(self.q_norm(self._heads(self.q_proj(x), self.num_heads)), *rope)
        block_keys, block_values = self.key_value(x, rope)
        keys = torch.cat([context_kv[0], block_keys], dim=2)
        values = torch.cat([context_kv[1], block_values], dim=2)
        out = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=mask, enable_gqa=self.num_heads != self.num_kv_heads
        )
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))


class DFlashDecoderLayer(nn.Module):
    """Qwen3 decoder layer (pre-norm, q/k norm, SwiGLU) with the context injected as extra keys/values."""

    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.self_attn = DFlashAttention(config)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], context_kv: tuple[Tensor, Tensor],
                mask: Tensor | None) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, context_kv, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class MarkovHead(nn.Module):
    """DSpark's transition bias from the previous token: `markov_w2(markov_w1[prev])` (V × r, then r × V)."""

    def __init__(self, vocab_size: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)

    def embed(self, prev_ids: Tensor) -> Tensor:
        return self.markov_w1(prev_ids)

    def bias(self, embeds: Tensor) -> Tensor:
        return self.markov_w2(embeds)


class ConfidenceHead(nn.Module):
    """DSpark's per-position acceptance estimate: a logit from [block hidden state; Markov embedding].

    Computed in float32, as vLLM's `DSparkConfidenceHead` does (its `proj` holds float32 parameters).
    """

    def __init__(self, input_dim: int):
        super().__init__()
        self.proj = nn.Linear(input_dim, 1, bias=True)

    def forward(self, hidden: Tensor, markov_embeds: Tensor) -> Tensor:
        features = torch.cat([hidden, markov_embeds.to(hidden.dtype)], dim=-1).float()
        return F.linear(features, self.proj.weight.float(), self.proj.bias.float()).squeeze(-1)


# --------------------------------------------------------------------------- context cache


@dataclass
class DFlashContextCache:
    """Per-layer projected context keys/values (B, H_kv, T, head_dim) and their absolute positions (B, T)."""

    keys: list[Tensor] = field(default_factory=list)
    values: list[Tensor] = field(default_factory=list)
    positions: Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.positions is None else self.positions.shape[1]


# --------------------------------------------------------------------------- model


class DFlashDraftModel(PreTrainedModel):
    config_class = DFlashConfig
    config: DFlashConfig
    base_model_prefix = "dflash"
    _no_split_modules = ["DFlashDecoderLayer"]

    def __init__(self, config: DFlashConfig):
        super().__init__(config)
        n_selected = len(config.target_layer_ids)
        self.layers = nn.ModuleList(DFlashDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.fc = nn.Linear(n_selected * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        if config.mask_mode == "learned":
            self.mask_embedding = nn.Parameter(torch.zeros(config.hidden_size))
        self.markov_head = MarkovHead(config.vocab_size, config.markov_rank) if config.is_dspark else None
        self.confidence_head = (ConfidenceHead(config.hidden_size + config.markov_rank)
                                if config.enable_confidence_head else None)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if self.markov_head is not None and module is self.markov_head.markov_w2:
            # a zero projection makes the fresh head add nothing: training starts from plain DFlash drafting
            # and the bias grows only as far as the previous token helps (w1 still gets gradients through w2)
            init.zeros_(module.weight)
            return
        super()._init_weights(module)
        if module is self and getattr(self, "mask_embedding", None) is not None:
            init.normal_(self.mask_embedding, mean=0.0, std=self.config.initializer_range)

    @property
    def block_size(self) -> int:
        return self.config.block_size

    # ----------------------------------------------------------------- context

    def fuse_target_hidden(self, hidden_states: Sequence[Tensor]) -> Tensor:
        """Verifier `output_hidden_states` tuple (embeddings first) -> (B, T, D) fused context features."""
        selected = [hidden_states[layer_id + 1] for layer_id in self.config.target_layer_ids]
        return self.hidden_norm(self.fc(torch.cat(selected, dim=-1).to(self.fc.weight.dtype)))

    def rope(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """Rotary (cos, sin) at absolute positions (B, T), computed once per pass for every layer."""
        return rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, dtype)

    def context_key_values(self, features: Tensor, positions: Tensor) -> list[tuple[Tensor, Tensor]]:
        rope = self.rope(positions, features.dtype)
        return [layer.self_attn.key_value(features, rope) for layer in self.layers]

    def new_context_cache(self) -> DFlashContextCache:
        return DFlashContextCache()

    def extend_context(self, cache: DFlashContextCache, features: Tensor, positions: Tensor) -> None:
        """Append fused features (B, T, D) at absolute positions (B, T) to the cache."""
        new = self.context_key_values(features, positions)
        if cache.positions is None:
            cache.keys = [k for k, _ in new]
            cache.values = [v for _, v in new]
            cache.positions = positions.clone()
            return
        cache.keys = [torch.cat([old, k], dim=2) for old, (k, _) in zip(cache.keys, new)]
        cache.values = [torch.cat([old, v], dim=2) for old, (_, v) in zip(cache.values, new)]
        cache.positions = torch.cat([cache.positions, positions], dim=1)

    def crop_context(self, cache: DFlashContextCache, length: int) -> None:
        """Keep the first `length` cached context positions (after a rejected draft)."""
        if cache.positions is None or length >= cache.length:
            return
        cache.keys = [k[:, :, :length] for k in cache.keys]
        cache.values = [v[:, :, :length] for v in cache.values]
        cache.positions = cache.positions[:, :length]

    # ----------------------------------------------------------------- blocks

    def embed_block(self, block_ids: Tensor, masked: Tensor, embed_tokens: nn.Module) -> Tensor:
        """Token embeddings of `block_ids`, with the mask embedding wherever `masked` is set."""
        if self.config.mask_mode == "token":
            ids = torch.where(masked, torch.full_like(block_ids, self.config.mask_token_id), block_ids)
            return embed_tokens(ids).to(self.fc.weight.dtype)
        embeds = embed_tokens(torch.where(masked, torch.zeros_like(block_ids), block_ids)).to(self.fc.weight.dtype)
        return torch.where(masked[..., None], self.mask_embedding.to(embeds.dtype), embeds)

    def run_layers(
        self, block_embeds: Tensor, positions: Tensor, context_kv: list[tuple[Tensor, Tensor]], mask: Tensor | None
    ) -> Tensor:
        hidden = block_embeds
        rope = self.rope(positions, block_embeds.dtype)
        for layer, kv in zip(self.layers, context_kv):
            hidden = layer(hidden, rope, kv, mask)
        return self.norm(hidden)

    def block_logits(
        self,
        context_kv: list[tuple[Tensor, Tensor]],
        context_positions: Tensor,
        context_valid: Tensor | None,
        block_ids: Tensor,
        masked: Tensor,
        anchor_positions: Tensor,
        embed_tokens: nn.Module,
        lm_head: nn.Module | None,
        sees_all: bool = False,
    ) -> Tensor:
        """The one DFlash pass that training, drafting and the ONNX graph all run.

        Blocks (B, N, L) start with their anchor at anchor_positions (B, N); `masked` positions get the
        mask embedding. Context keys/values per layer (B, H_kv, T, head_dim) sit at context_positions
        (B, T), `context_valid` (B, T) or None. Returns logits (B, N, L−1, V) for block positions 1..L−1,
        or with `lm_head` None the normed hidden states (B, N, L−1, D) the LM head (and a DSpark
        confidence head) reads. `sees_all`: the caller has checked that the mask would show every key (all
        context valid and before every anchor, blocks not causal, one block), so attention runs unmasked.
        """
        batch, n_blocks, size = block_ids.shape
        offsets = torch.arange(size, device=block_ids.device)
        positions = (anchor_positions[..., None] + offsets).reshape(batch, n_blocks * size)
        embeds = self.embed_block(block_ids, masked, embed_tokens).reshape(batch, n_blocks * size, -1)
        mask = None if sees_all else block_attention_mask(context_positions, context_valid, anchor_positions, size,
                                                          self.config.causal)
        hidden = self.run_layers(embeds, positions, context_kv, mask).view(batch, n_blocks, size, -1)[:, :, 1:]
        return hidden if lm_head is None else lm_head(hidden)

    # ----------------------------------------------------------------- DSpark heads

    def markov_embed(self, prev_ids: Tensor) -> Tensor:
        """r-dim Markov embedding of the previous block tokens (any shape -> (..., r))."""
        if self.markov_head is None:
            raise ValueError("this block drafter has no Markov head (markov_rank 0)")
        return self.markov_head.embed(prev_ids)

    def markov_logits(self, base_logits: Tensor, prev_ids: Tensor) -> Tensor:
        """Base logits (..., V) plus the Markov bias from the previous tokens (...): the distribution a DSpark
        position drafts from. Training passes the verifier's tokens, drafting the tokens it just drafted."""
        return base_logits + self.markov_head.bias(self.markov_embed(prev_ids)).to(base_logits.dtype)

    def markov_bias_table(self) -> Tensor:
        """(V, V): row v is the Markov bias after token v, what `markov_logits` adds to a position's logits."""
        return self.markov_head.bias(self.markov_head.markov_w1.weight)

    def confidence_logits(self, hidden: Tensor, prev_ids: Tensor) -> Tensor:
        """Acceptance logits (...) of positions with hidden states (..., D) after tokens `prev_ids` (...)."""
        if self.confidence_head is None:
            raise ValueError("this block drafter has no confidence head")
        return self.confidence_head(hidden, self.markov_embed(prev_ids))

    def forward(
        self,
        context_features: Tensor,
        context_valid: Tensor,
        block_ids: Tensor,
        anchor_positions: Tensor,
        embed_tokens: nn.Module,
        lm_head: nn.Module,
        return_hidden: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Training: all blocks of each sequence in one pass over features (B, T, D) at positions 0..T−1.

        block_ids (B, N, L) (the anchor at index 0, the rest is masked); anchor_positions (B, N). Block j
        sees the valid context at positions < anchor_positions[j] and all of its own block, nothing of
        other blocks. Returns the base logits (B, N, L−1, V) (before any Markov bias), with the hidden
        states (B, N, L−1, D) too when `return_hidden` (the confidence head reads them).
        """
        batch, total = context_features.shape[:2]
        context_positions = torch.arange(total, device=block_ids.device).expand(batch, total)
        context_kv = self.context_key_values(context_features, context_positions)
        masked = (torch.arange(block_ids.shape[-1], device=block_ids.device) > 0).expand_as(block_ids)
        hidden = self.block_logits(context_kv, context_positions, context_valid.bool(), block_ids, masked,
                                   anchor_positions, embed_tokens, None)
        return (lm_head(hidden), hidden) if return_hidden else lm_head(hidden)

    @torch.no_grad()
    def draft_block(
        self,
        cache: DFlashContextCache,
        anchor_ids: Tensor,
        anchor_positions: Tensor,
        embed_tokens: nn.Module,
        lm_head: nn.Module,
        denoise_steps: int = 1,
        return_hidden: bool = False,
    ) -> tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor]:
        """Draft the B−1 tokens after each anchor: ids (B, block_size−1) and logits (B, block_size−1, V)
        (the parallel pass: a DSpark drafter's Markov bias is added position by position afterwards), and
        with `return_hidden` the last pass's hidden states (B, block_size−1, D).

        The cached context is gated by position (only positions < the anchor's are visible), so a
        cache holding more than the committed prefix cannot leak into the draft. `denoise_steps` > 1
        commits the most confident masked positions each step and re-runs with them unmasked.
        """
        if cache.positions is None:
            raise ValueError("draft_block needs a context: call extend_context first")
        if denoise_steps < 1:
            raise ValueError(f"denoise_steps must be >= 1, got {denoise_steps}")
        size = self.block_size
        block_ids, masked = anchor_blocks(anchor_ids[:, None], size)
        context_kv = list(zip(cache.keys, cache.values))
        # decoding drafts after its committed prefix, so the position gate hides nothing: skip building the mask
        sees_all = not self.config.causal and bool((cache.positions < anchor_positions[:, None]).all())

        def one_pass(ids: Tensor, still: Tensor) -> Tensor:
            return self.block_logits(context_kv, cache.positions, None, ids, still, anchor_positions[:, None],
                                     embed_tokens, None, sees_all)[:, 0]

        passes = min(denoise_steps, size - 1)
        if passes == 1:  # one pass commits every position: none of the unmasking bookkeeping below
            hidden = one_pass(block_ids, masked)
            logits = lm_head(hidden)
            return (logits.argmax(-1), logits, hidden) if return_hidden else (logits.argmax(-1), logits)
        block_ids, masked = block_ids.clone(), masked.clone()
        final_logits: Tensor | None = None
        hidden: Tensor | None = None
        for step in range(passes):
            hidden = one_pass(block_ids, masked)
            logits = lm_head(hidden)
            still_masked = masked[:, 0, 1:]
            if final_logits is None:
                final_logits = logits.clone()
            final_logits[still_masked] = logits[still_masked]
            commit = math.ceil(int(still_masked[0].sum()) / (passes - step))
            confidence = logits.float().softmax(-1).amax(-1).masked_fill(~still_masked, -1.0)
            chosen = confidence.topk(commit, dim=-1).indices
            block_ids[:, 0, 1:].scatter_(1, chosen, logits.argmax(-1).gather(1, chosen))
            masked[:, 0, 1:].scatter_(1, chosen, False)
        if return_hidden:
            return final_logits.argmax(-1), final_logits, hidden
        return final_logits.argmax(-1), final_logits


def anchor_blocks(anchor_ids: Tensor, block_size: int) -> tuple[Tensor, Tensor]:
    """Fresh blocks `[anchor, MASK × (L−1)]` for anchors (B, N): ids (B, N, L) and the masked flags (B, N, L)."""
    shape = (*anchor_ids.shape, block_size)
    offsets = torch.arange(block_size, device=anchor_ids.device)
    return anchor_ids[..., None].expand(shape), (offsets > 0).expand(shape)


def block_attention_mask(context_positions: Tensor, context_valid: Tensor | None, anchor_positions: Tensor,
                         block_size: int, causal: bool = False) -> Tensor:
    """(B, 1, N·L, T + N·L) bool: block j sees valid context at positions < its anchor, and only itself
    (with `causal`, each position only its own and earlier block positions).

    Gated by absolute anchor position (not block index), so overlapping or unsorted anchors stay exact,
    and a context cache holding more than the committed prefix cannot leak into a draft.
    """
    batch, n_blocks = anchor_positions.shape
    to_context = context_positions[:, None, :] < anchor_positions[..., None]  # (B, N, T)
    if context_valid is not None:
        to_context = to_context & context_valid[:, None, :]
    to_context = to_context.repeat_interleave(block_size, dim=1)  # (B, N·L, T)
    block_of = torch.arange(n_blocks, device=anchor_positions.device).repeat_interleave(block_size)
    to_blocks = block_of[:, None] == block_of[None, :]
    if causal:
        offset = torch.arange(block_size, device=anchor_positions.device).repeat(n_blocks)
        to_blocks = to_blocks & (offset[None, :] <= offset[:, None])
    to_blocks = to_blocks.expand(batch, -1, -1)
    return torch.cat([to_context, to_blocks], dim=2)[:, None]


def verifier_parts(verifier: nn.Module) -> tuple[nn.Module, nn.Module, int, int]:
    """(embed_tokens, lm_head, number of decoder layers, hidden size) of any HF decoder LM."""
    text_config = verifier.config.get_text_config()
    return (
        verifier.get_input_embeddings(),
        verifier.get_output_embeddings(),
        int(text_config.num_hidden_layers),
        int(text_config.hidden_size),
    )


def drafter_config(verifier: nn.Module, cfg: BlockFamilyConfig, mask_token_id: int | None,
                   mask_rule: str | None = None) -> DFlashConfig:
    """The DFlash config for `verifier` from params: width, vocabulary and RoPE base follow the verifier.
    No `mask_token_id` means a learned mask embedding; `mask_rule` says why that id was chosen."""
    text = verifier.config.get_text_config()
    _, _, depth, hidden = verifier_parts(verifier)
    mask_mode = "learned" if mask_token_id is None else "token"
    layer_ids = target_layer_ids(cfg, depth)
    heads = cfg.num_heads or int(text.num_attention_heads)
    kv_heads = cfg.num_kv_heads or int(getattr(text, "num_key_value_heads", None) or heads)
    if heads % kv_heads:
        raise DraftlineError(f"train.{cfg.kind}.num_heads ({heads}) must be a multiple of num_kv_heads ({kv_heads})")
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
        dflash_config={"mask_token_id": mask_token_id, "target_layer_ids": layer_ids,
                       "causal": cfg.attention == "causal"},
        mask_mode=mask_mode,
        mask_rule=mask_rule,
        markov_rank=cfg.markov_rank,
        enable_confidence_head=cfg.confidence_head,
        eos_token_id=getattr(text, "eos_token_id", None),
        pad_token_id=getattr(text, "pad_token_id", None),
    )


def build_drafter(verifier: nn.Module, cfg: BlockFamilyConfig, mask_token_id: int | None,
                  mask_rule: str | None = None, seed: int = 0) -> DFlashDraftModel:
    """A fresh drafter whose final norm starts as the verifier's: its output feeds the verifier's frozen
    LM head, which was trained on exactly that norm's scale."""
    torch.manual_seed(seed)
    drafter = DFlashDraftModel(drafter_config(verifier, cfg, mask_token_id, mask_rule))
    final_norm = getattr(verifier.get_decoder(), "norm", None)
    weight = getattr(final_norm, "weight", None)
    if weight is not None and weight.shape == drafter.norm.weight.shape:
        with torch.no_grad():
            drafter.norm.weight.copy_(weight)
    return drafter


def load_drafter(path: Path, kind: str, dtype: torch.dtype = torch.float32) -> DFlashDraftModel:
    """A trained (or served) drafter of block-family `kind`, frozen, for decoding and export."""
    require_checkpoint(path, kind)
    architectures = json.loads((path / "config.json").read_text(encoding="utf-8")).get("architectures") or []
    if not {"DFlashDraftModel", "Qwen3DSparkModel"} & set(architectures):  # trained / served (DFlash or DSpark)
        raise DraftlineError(f"{path}/config.json is not a DFlash drafter (architectures={architectures}); "
                             f"re-run `dvc repro train_{kind}`")
    model = load_pretrained(DFlashDraftModel.from_pretrained, path, f"{kind} drafter at {path}",
                            f"retrain it (`dvc repro train_{kind}`)", use_safetensors=True, dtype=dtype)
    return model.eval().requires_grad_(False)


AutoConfig.register(DFlashConfig.model_type, DFlashConfig, exist_ok=True)
AutoModel.register(DFlashConfig, DFlashDraftModel, exist_ok=True)
