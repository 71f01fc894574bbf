"""The AR drafter in the decoding loop: backends with their own KV cache, and its proposer.

`ARDraftBackend` is the interface every AR backend implements: PyTorch over a transformers
`DynamicCache` (`TorchARDrafter`) or ONNX Runtime over the exported graph with its flat cache
(`OnnxARDrafter`). The proposer only feeds tokens, reads last-position logits and crops the cache
after a rejection.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from transformers import DynamicCache, PreTrainedModel

from pipeline.config.sampling_config import SamplingConfig
from pipeline.kv_cache import crop_cache
from pipeline.sampling import sample, warp_probs


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


class ARProposer:
    """k tokens from an AR drafter; its cache is synced to the committed tokens by common prefix."""

    uses_hidden_states = False

    def __init__(self, backend: ARDraftBackend, draft_tokens: int):
        self.backend = backend
        self.draft_tokens = draft_tokens
        self.cached: list[int] = []  # the token ids whose keys/values the backend holds

    def reset(self) -> None:
        self.backend.reset()
        self.cached = []

    def sync(self, tokens: list[int]) -> None:
        keep = 0
        limit = min(len(self.cached), len(tokens) - 1)  # the last token is always fed, for its logits
        while keep < limit and self.cached[keep] == tokens[keep]:
            keep += 1
        self.backend.crop(keep)
        del self.cached[keep:]

    def propose(self, tokens: list[int], k: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> tuple[list[int], torch.Tensor | None]:
        self.sync(tokens)
        pending = tokens[len(self.cached):]
        drafts: list[int] = []
        probs: list[torch.Tensor] = []
        for _ in range(k):
            logits = self.backend.forward(pending)
            self.cached.extend(pending)
            if sampling.greedy:
                token = int(logits.argmax())
            else:
                q = warp_probs(logits, sampling)
                token = sample(q, generator)
                probs.append(q)
            drafts.append(token)
            pending = [token]
        return drafts, (torch.stack(probs) if probs else None)

    def observe(self, hidden_states, first_position, count) -> None:
        """Never called (`uses_hidden_states` is False): the AR drafter keeps its own cache."""
