"""What the speculative decoding loop drives: a drafter kind's proposer (training's validation decodes
with it too, so this module stays free of export and evaluation code)."""

from __future__ import annotations

from typing import Protocol

import torch

from pipeline.config.sampling_config import SamplingConfig


class Proposer(Protocol):
    """A drafter as the decoding loop (`pipeline.drafters.speculative_loop.decode`) drives it, batch size 1."""

    uses_hidden_states: bool  # wants the verifier's hidden states of committed positions (`observe`)
    draft_tokens: int  # drafts per verifier step

    def reset(self) -> None: ...

    def propose(self, tokens: list[int], k: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> tuple[list[int], torch.Tensor | None]:
        """Up to k draft tokens after `tokens`, and their proposal probabilities (k, V) (None: one-hot)."""

    def observe(self, hidden_states: tuple[torch.Tensor, ...], first_position: int, count: int) -> None:
        """Verifier features of `count` newly committed positions starting at `first_position`."""
