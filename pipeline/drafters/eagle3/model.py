"""The EAGLE-3 drafter head (arXiv 2503.01840): one Llama-style decoder layer fed by the verifier.

At position t the head reads `fc(concat(verifier hidden states at the aux layers, position t))` and
the embedding of the token at t + 1, and predicts the token at t + 2. The decoder layer's attention
input is `concat(input_layernorm(embedding), hidden_norm(hidden))` (2·hidden wide); its output
before the final norm (`prenorm`) replaces the fused verifier features when the head drafts on from
its own previous step. The embedding is the verifier's (frozen, not saved); the LM head is the
head's own, over the full vocabulary or a reduced draft vocabulary mapped back by `d2t`
(target id = draft id + d2t[draft id]).

Weight and config names are those vLLM's `llama_eagle3.py` loads (`fc`, `midlayer.*`, `norm`,
`lm_head`, `d2t`, `t2d`; `draft_vocab_size`, `target_hidden_size`,
`eagle_aux_hidden_state_layer_ids`, `norm_before_residual`), so the saved checkpoint needs only a
config rewrite to be served (serving.py).

Design: docs/algorithms.md#eagle3-head.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm

from pipeline.drafters.eagle3.config import Eagle3DrafterConfig, default_aux_layer_ids
from pipeline.drafters.rope import apply_rope, rope_cos_sin
from pipeline.errors import DraftlineError
from pipeline.integrity import load_pretrained, require_checkpoint


def draft_vocabulary(sequences: Iterable[Sequence[int]], vocab_size: int, size: int) -> Tensor:
    """The `size` most frequent token ids of `sequences` (ties and unseen ids by id), sorted ascending."""
    if not 1 < size <= vocab_size:
        raise DraftlineError(f"train.eagle3.draft_vocab_size must be in 2..{vocab_size} (the verifier's), got {size}")
    counts = Counter()
    for sequence in sequences:
        counts.update(sequence)
    order = sorted(range(vocab_size), key=lambda token: (-counts.get(token, 0), token))
    return torch.tensor(sorted(order[:size]), dtype=torch.long)


class Eagle3Config(PretrainedConfig):
    model_type = "draftline_eagle3"

    def __init__(
        self,
        hidden_size: int = 128,
        num_attention_heads: int = 4,
        num_key_value_heads: int = 2,
        head_dim: int = 32,
        intermediate_size: int = 384,
        hidden_act: str = "silu",
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 1_000_000.0,
        max_position_embeddings: int = 4096,
        vocab_size: int = 4096,
        draft_vocab_size: int | None = None,
        target_hidden_size: int | None = None,
        num_target_layers: int = 4,
        eagle_aux_hidden_state_layer_ids: list[int] | None = None,
        norm_before_residual: bool = False,
        initializer_range: float = 0.02,
        **kwargs,
    ):
        self.hidden_size = hidden_size
        self.num_hidden_layers = 1
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.rope_parameters = {"rope_type": "default", "rope_theta": rope_theta}
        self.max_position_embeddings = max_position_embeddings
        self.vocab_size = vocab_size
        self.draft_vocab_size = draft_vocab_size or vocab_size
        self.target_hidden_size = target_hidden_size or hidden_size
        self.num_target_layers = num_target_layers
        self.eagle_aux_hidden_state_layer_ids = list(eagle_aux_hidden_state_layer_ids
                                                     or default_aux_layer_ids(num_target_layers))
        self.norm_before_residual = norm_before_residual
        self.initializer_range = initializer_range
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)

    @property
    def reduced_vocab(self) -> bool:
        return self.draft_vocab_size != self.vocab_size


class Eagle3Attention(nn.Module):
    """Llama attention over the 2·hidden-wide input; no q/k norm, as vLLM's Llama EAGLE-3 layer."""

    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.head_dim = config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.rope_theta = config.rope_theta
        width = 2 * config.hidden_size
        self.q_proj = nn.Linear(width, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(width, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(width, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

    def _heads(self, x: Tensor, heads: int) -> Tensor:
        return x.view(*x.shape[:2], heads, self.head_dim).transpose(1, 2)

    def project(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T, 2D) at absolute positions (B, T) -> roped queries (B, H, T, d), keys and values (B, H_kv, T, d)."""
        cos, sin = rope_cos_sin(positions, self.head_dim, self.rope_theta, x.dtype)
        queries = apply_rope(self._heads(self.q_proj(x), self.num_heads), cos, sin)
        keys = apply_rope(self._heads(self.k_proj(x), self.num_kv_heads), cos, sin)
        return queries, keys, self._heads(self.v_proj(x), self.num_kv_heads)

    def repeat_kv(self, x: Tensor) -> Tensor:
        return x.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)

    def output(self, attended: Tensor) -> Tensor:
        """(B, H, T, d) -> (B, T, D)."""
        return self.o_proj(attended.transpose(1, 2).reshape(attended.shape[0], attended.shape[2], -1))


class Eagle3DecoderLayer(nn.Module):
    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.self_attn = Eagle3Attention(config)
        self.mlp = Qwen3MLP(config)  # gate/up/down SwiGLU: the Llama MLP under the same names
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.norm_before_residual = config.norm_before_residual

    def attention_input(self, embeds: Tensor, hidden: Tensor) -> tuple[Tensor, Tensor]:
        """(attention input (B, T, 2D), residual (B, T, D)), as vLLM's first EAGLE-3 layer forms them."""
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        return torch.cat([self.input_layernorm(embeds), normed], dim=-1), residual

    def finish(self, attention_out: Tensor, residual: Tensor) -> Tensor:
        """The layer's output plus residual: the pre-final-norm state the next draft step starts from."""
        residual = attention_out + residual
        return self.mlp(self.post_attention_layernorm(residual)) + residual


@dataclass
class Eagle3Cache:
    """Keys/values (1, H, P, d) of positions 0..P−1: committed positions, then any in-flight drafts."""

    keys: Tensor | None = None
    values: Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def crop(self, length: int) -> None:
        if self.keys is not None:
            self.keys, self.values = self.keys[:, :, :length], self.values[:, :, :length]


class Eagle3DraftModel(PreTrainedModel):
    config_class = Eagle3Config
    config: Eagle3Config
    base_model_prefix = "eagle3"
    _no_split_modules = ["Eagle3DecoderLayer"]

    def __init__(self, config: Eagle3Config):
        super().__init__(config)
        n_aux = len(config.eagle_aux_hidden_state_layer_ids)
        self.fc = nn.Linear(n_aux * config.target_hidden_size, config.hidden_size, bias=False)
        self.midlayer = Eagle3DecoderLayer(config)
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        if config.reduced_vocab:
            self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.post_init()

    def set_draft_vocabulary(self, draft_ids: Tensor) -> None:
        """Draft id i predicts verifier id draft_ids[i] (ascending)."""
        if not self.config.reduced_vocab:
            raise ValueError("a full-vocabulary head has no draft vocabulary to set")
        with torch.no_grad():
            self.d2t.copy_(draft_ids - torch.arange(len(draft_ids)))
            self.t2d.zero_()
            self.t2d[draft_ids] = True

    @property
    def draft_ids(self) -> Tensor | None:
        """The verifier id of every draft id, or None for the full vocabulary."""
        if not self.config.reduced_vocab:
            return None
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    # ----------------------------------------------------------------- pieces

    def aux_hidden(self, hidden_states: Sequence[Tensor | None]) -> Tensor:
        """Verifier `output_hidden_states` tuple (embeddings first) -> (B, T, n_aux·D) concatenated aux states."""
        selected = [hidden_states[layer_id] for layer_id in self.config.eagle_aux_hidden_state_layer_ids]
        return torch.cat(selected, dim=-1).to(self.fc.weight.dtype)

    def logits(self, prenorm: Tensor) -> Tensor:
        """Draft-vocabulary logits of pre-norm states."""
        return self.lm_head(self.norm(prenorm))

    def full_vocab_logits(self, draft_logits: Tensor) -> Tensor:
        """Draft-vocabulary logits -> verifier-vocabulary logits (−inf off the draft vocabulary); a
        gather, not a scatter, so the ONNX graph stays plain."""
        if not self.config.reduced_vocab:
            return draft_logits
        rank = (self.t2d.long().cumsum(0) - 1).clamp(min=0)  # draft id of every verifier id in the draft vocabulary
        gathered = draft_logits.index_select(-1, rank)
        return gathered.masked_fill(~self.t2d, float("-inf"))

    # ----------------------------------------------------------------- training

    def forward(self, aux_hidden: Tensor, input_ids: Tensor, attention_mask: Tensor, embed_tokens: nn.Module,
                steps: int) -> list[Tensor]:
        """Training-time test over right-padded sequences: draft-vocabulary logits (B, T, V_d) per step.

        Step 0 at index t is the head at position t: fused verifier features of t and the token at t+1,
        predicting the token at t+2. Step j at index t continues that draft: position t+j, the head's own
        step j−1 state, the (teacher-forced) token at t+j+1, predicting the token at t+j+2. Its query
        sees step 0's keys at positions <= t (the committed context) and the keys of steps 1..j at index
        t (its own draft chain), exactly what it sees when drafting at serving time.
        """
        layer, attn = self.midlayer, self.midlayer.self_attn
        batch, total = input_ids.shape
        positions = torch.arange(total, device=input_ids.device).expand(batch, total)
        valid = attention_mask.bool()
        causal = torch.ones(total, total, dtype=torch.bool, device=input_ids.device).tril()
        context_mask = (causal[None] & valid[:, None, :])[:, None]  # (B, 1, T, T)
        scale = attn.head_dim ** -0.5
        hidden = self.fc(aux_hidden)
        chain_keys: list[Tensor] = []
        chain_values: list[Tensor] = []
        context: tuple[Tensor, Tensor] | None = None
        outputs = []
        for step in range(steps):
            tokens = shift_left(input_ids, step + 1)
            x, residual = layer.attention_input(embed_tokens(tokens).to(hidden.dtype), hidden)
            queries, keys, values = attn.project(x, positions + step)
            keys, values = attn.repeat_kv(keys), attn.repeat_kv(values)
            if context is None:
                context = (keys, values)
            else:
                chain_keys.append(keys)
                chain_values.append(values)
            scores = (queries @ context[0].transpose(-1, -2) * scale).masked_fill(~context_mask, float("-inf"))
            chain = [(queries * key).sum(-1, keepdim=True) * scale for key in chain_keys]
            weights = torch.cat([scores, *chain], dim=-1).float().softmax(-1).to(queries.dtype)
            attended = weights[..., :total] @ context[1]
            for i, value in enumerate(chain_values):
                attended = attended + weights[..., total + i: total + i + 1] * value
            hidden = layer.finish(attn.output(attended), residual)
            outputs.append(self.logits(hidden))
        return outputs

    # ----------------------------------------------------------------- decoding

    def decode_step(self, hidden: Tensor, token_embeds: Tensor, past_keys: Tensor, past_values: Tensor,
                    ) -> tuple[Tensor, Tensor, Tensor]:
        """Positions P..P+n−1 right after the P cached ones: hidden (B, n, D) (fused features or the
        previous step's state), the embedded token after each position (B, n, D), cached keys/values
        (B, H_kv, P, d). Returns pre-norm states (B, n, D) and the keys/values of all P+n positions.
        Shapes alone fix the positions and the causal mask, so the ONNX graph is this same code."""
        layer, attn = self.midlayer, self.midlayer.self_attn
        cached, count = past_keys.shape[2], hidden.shape[1]
        query_positions = torch.arange(count, device=hidden.device) + cached
        x, residual = layer.attention_input(token_embeds.to(hidden.dtype), hidden)
        queries, keys, values = attn.project(x, query_positions.expand(hidden.shape[0], count))
        keys, values = torch.cat([past_keys, keys], dim=2), torch.cat([past_values, values], dim=2)
        visible = torch.arange(cached + count, device=hidden.device)[None] <= query_positions[:, None]
        attended = F.scaled_dot_product_attention(queries, attn.repeat_kv(keys), attn.repeat_kv(values),
                                                  attn_mask=visible)
        return layer.finish(attn.output(attended), residual), keys, values

    @torch.no_grad()
    def step(self, cache: Eagle3Cache, hidden: Tensor, token_ids: Tensor, start: int,
             embed_tokens: nn.Module) -> Tensor:
        """`decode_step` at positions start..start+n−1 (`cache` must hold exactly the positions before),
        appending their keys/values to `cache`. Returns their pre-norm states (1, n, D)."""
        if cache.length != start:
            raise ValueError(f"cache holds {cache.length} positions, the step starts at {start}")
        if cache.keys is None:
            attn = self.midlayer.self_attn
            cache.keys = hidden.new_zeros((hidden.shape[0], attn.num_kv_heads, 0, attn.head_dim))
            cache.values = cache.keys
        state, cache.keys, cache.values = self.decode_step(hidden, embed_tokens(token_ids), cache.keys, cache.values)
        return state


def shift_left(input_ids: Tensor, by: int) -> Tensor:
    """(B, T) -> the token `by` positions later at every index (0 past the end; those targets are masked)."""
    return torch.cat([input_ids[:, by:], torch.zeros_like(input_ids[:, :by])], dim=1)


def drafter_config(verifier: nn.Module, cfg: Eagle3DrafterConfig) -> Eagle3Config:
    """The head's config for `verifier` from params: width, heads, RoPE and vocabulary follow the verifier
    (its embedding is the verifier's, so the widths must match)."""
    text = verifier.config.get_text_config()
    depth, hidden = int(text.num_hidden_layers), int(text.hidden_size)
    layer_ids = list(cfg.aux_layer_ids or default_aux_layer_ids(depth))
    if any(not 1 <= layer_id < depth for layer_id in layer_ids):
        raise DraftlineError(f"train.eagle3.aux_layer_ids {layer_ids} out of range for a {depth}-layer verifier; use "
                             f"ids in 1..{depth - 1} (id L is the input of layer L) or null for the default")
    heads = int(text.num_attention_heads)
    rope = getattr(text, "rope_parameters", None) or {}
    vocab = int(text.vocab_size)
    return Eagle3Config(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(text, "head_dim", None) or hidden // heads),
        intermediate_size=cfg.intermediate_size or int(text.intermediate_size),
        rms_norm_eps=float(getattr(text, "rms_norm_eps", 1e-6)),
        rope_theta=float(rope.get("rope_theta", getattr(text, "rope_theta", 10_000.0))),
        max_position_embeddings=int(getattr(text, "max_position_embeddings", 4096)),
        vocab_size=vocab,
        draft_vocab_size=cfg.draft_vocab_size or vocab,
        target_hidden_size=hidden,
        num_target_layers=depth,
        eagle_aux_hidden_state_layer_ids=layer_ids,
        norm_before_residual=cfg.norm_before_residual,
        eos_token_id=getattr(text, "eos_token_id", None),
        pad_token_id=getattr(text, "pad_token_id", None),
    )


def build_drafter(verifier: nn.Module, cfg: Eagle3DrafterConfig, token_sequences: Iterable[Sequence[int]],
                  seed: int = 0) -> Eagle3DraftModel:
    """A fresh head: final norm and LM head start as the verifier's (rows of its draft vocabulary), so
    the untrained head already reads its state the way the verifier reads its own."""
    torch.manual_seed(seed)
    config = drafter_config(verifier, cfg)
    drafter = Eagle3DraftModel(config)
    draft_ids = None
    if config.reduced_vocab:
        draft_ids = draft_vocabulary(token_sequences, config.vocab_size, config.draft_vocab_size)
        drafter.set_draft_vocabulary(draft_ids)
    with torch.no_grad():
        final_norm = getattr(verifier.get_decoder(), "norm", None)
        if getattr(final_norm, "weight", None) is not None and final_norm.weight.shape == drafter.norm.weight.shape:
            drafter.norm.weight.copy_(final_norm.weight)
        head = verifier.get_output_embeddings().weight
        drafter.lm_head.weight.copy_(head if draft_ids is None else head[draft_ids])
    return drafter


def load_drafter(path: Path, dtype: torch.dtype = torch.float32) -> Eagle3DraftModel:
    """A trained EAGLE-3 head, or its served copy (config rewritten for vLLM), frozen, for decoding and export."""
    require_checkpoint(path, "eagle3")
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    served = config.get("model_type") == "llama" and "LlamaForCausalLMEagle3" in (config.get("architectures") or [])
    if config.get("model_type") != Eagle3Config.model_type and not served:
        raise DraftlineError(f"{path}/config.json is not an EAGLE-3 head (model_type={config.get('model_type')!r}); "
                             "re-run `dvc repro train_eagle3`")
    fields = {key: value for key, value in config.items() if key not in ("model_type", "architectures", "eagle_config")}
    model = load_pretrained(Eagle3DraftModel.from_pretrained, path, f"eagle3 drafter at {path}",
                            "retrain it (`dvc repro train_eagle3`)", config=Eagle3Config(**fields), dtype=dtype)
    return model.eval().requires_grad_(False)


AutoConfig.register(Eagle3Config.model_type, Eagle3Config, exist_ok=True)
AutoModel.register(Eagle3Config, Eagle3DraftModel, exist_ok=True)
