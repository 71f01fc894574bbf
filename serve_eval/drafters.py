"""Drafters as the decoding loops see them: an AR backend interface and the DFlash block drafter.

`ARDraftBackend` is the stable interface every AR drafter backend implements (torch here,
ONNX Runtime in `serve_eval.onnx_backend`, which exposes
`load_onnx_ar_drafter(export_dir: Path) -> ARDraftBackend`). A backend owns its KV cache; the loop
only feeds tokens, reads last-position logits and crops the cache after a rejection.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel

from pipeline.errors import DraftlineError
from serve_eval.cache import crop_cache


@runtime_checkable
class ARDraftBackend(Protocol):
    """An autoregressive drafter with its own KV cache, batch size 1."""

    name: str  # "torch", "onnx", ...

    @property
    def cache_length(self) -> int:
        """Number of tokens whose keys/values are cached."""

    def reset(self) -> None:
        """Drop the cache (start of a new prompt)."""

    def forward(self, token_ids: list[int]) -> torch.Tensor:
        """Append `token_ids` (n >= 1) at positions cache_length.. and return the last position's
        logits as a float32 (V,) tensor."""

    def crop(self, length: int) -> None:
        """Keep only the first `length` cached tokens (length <= cache_length)."""


class TorchARDrafter:
    """`ARDraftBackend` over an HF causal LM with a transformers `DynamicCache`."""

    name = "torch"

    def __init__(self, model: PreTrainedModel):
        self.model = model
        self.cache = DynamicCache(config=model.config)

    @property
    def cache_length(self) -> int:
        return self.cache.get_seq_length()

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def forward(self, token_ids: list[int]) -> torch.Tensor:
        input_ids = torch.tensor([token_ids], device=self.model.device)
        out = self.model(input_ids=input_ids, cache=self.cache, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1].float()

    def crop(self, length: int) -> None:
        crop_cache(self.cache, length)


class BlockDrafter:
    """A `DFlashDraftModel` bound to the verifier's frozen embedding and LM head, with its context cache.

    The context cache holds projected verifier features of every committed position before the
    anchor, so its length always equals the verifier's KV-cache length.
    """

    def __init__(self, model: torch.nn.Module, verifier: PreTrainedModel, denoise_steps: int = 1):
        self.model = model
        self.embed_tokens = verifier.get_input_embeddings()
        self.lm_head = verifier.get_output_embeddings()
        self.denoise_steps = denoise_steps
        self.block_size = int(model.config.block_size)
        self.context_length = 0
        self.cache = model.new_context_cache()

    def reset(self) -> None:
        self.cache = self.model.new_context_cache()
        self.context_length = 0

    @torch.inference_mode()
    def extend(self, hidden_states: tuple[torch.Tensor, ...], first_position: int, count: int) -> None:
        """Append the features of the first `count` positions of a verifier forward that started at
        absolute position `first_position` (which must equal the current context length)."""
        if count == 0:
            return
        assert first_position == self.context_length, "context features must stay contiguous"
        features = self.model.fuse_target_hidden(tuple(h[:, :count] for h in hidden_states))
        positions = torch.arange(first_position, first_position + count, device=features.device)[None]
        self.model.extend_context(self.cache, features, positions)
        self.context_length += count

    @torch.inference_mode()
    def draft(self, anchor_id: int, anchor_position: int) -> list[int]:
        device = self.embed_tokens.weight.device
        ids, _ = self.model.draft_block(
            self.cache,
            torch.tensor([anchor_id], device=device),
            torch.tensor([anchor_position], device=device),
            self.embed_tokens,
            self.lm_head,
            denoise_steps=self.denoise_steps,
        )
        return ids[0].tolist()


def require_drafter_dir(path: Path, kind: str) -> None:
    if not (path / "config.json").exists():
        raise DraftlineError(
            f"drafter '{kind}' not found at {path}; run `dvc repro train_{kind}` "
            f"(or remove '{kind}' from evaluate.drafters in params.yaml)"
        )


def load_ar_model(path: Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    require_drafter_dir(path, "ar")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model.eval().requires_grad_(False)


def load_block_model(path: Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    require_drafter_dir(path, "block")
    architectures = json.loads((path / "config.json").read_text()).get("architectures") or []
    if "DFlashDraftModel" not in architectures:
        raise DraftlineError(f"{path}/config.json is not a DFlash drafter (architectures={architectures}); "
                             "re-run `dvc repro train_block`")
    from train.block_model import DFlashDraftModel  # lazy: only the block drafter needs train/

    model = DFlashDraftModel.from_pretrained(path, dtype=dtype)
    return model.eval().requires_grad_(False)
