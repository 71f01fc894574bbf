"""The block drafter in the decoding loop: the DFlash drafter with its context cache (PyTorch or ONNX
Runtime) and its proposer, which drafts block_size − 1 tokens per verifier step in one pass."""

from __future__ import annotations

from typing import Protocol

import torch
from transformers import PreTrainedModel

from pipeline.config.sampling_config import SamplingConfig
from pipeline.drafters.block.model import DFlashDraftModel
from pipeline.sampling import warp_probs


class BlockDraftBackend(Protocol):
    """What `BlockProposer` drives: `BlockDrafter` here, or the ONNX Runtime drafter (`block/onnx.py`)."""

    block_size: int

    def reset(self) -> None: ...

    def extend(self, hidden_states: tuple[torch.Tensor, ...], first_position: int, count: int) -> None: ...

    def draft(self, anchor_id: int, anchor_position: int) -> torch.Tensor: ...


class BlockDrafter:
    """A `DFlashDraftModel` bound to the verifier's frozen embedding and LM head, with its context cache.

    The context cache holds projected verifier features of every committed position before the
    anchor, so its length always equals the verifier's KV-cache length.
    """

    def __init__(self, model: DFlashDraftModel, verifier: PreTrainedModel, denoise_steps: int = 1):
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
    def draft(self, anchor_id: int, anchor_position: int) -> torch.Tensor:
        """Logits (block_size − 1, V) of the block after the anchor."""
        device = self.embed_tokens.weight.device
        _, logits = self.model.draft_block(self.cache, torch.tensor([anchor_id], device=device),
                                           torch.tensor([anchor_position], device=device), self.embed_tokens,
                                           self.lm_head, denoise_steps=self.denoise_steps)
        return logits[0]


class BlockProposer:
    """B−1 tokens in one DFlash drafter pass from cached verifier features.

    Greedy: the argmax of each position (q one-hot). Sampled: each position is drawn from its own
    warped distribution q_i, and q is returned for rejection sampling; the block's positions are
    drafted independently given the anchor, so q_i is exactly the distribution draft i came from and
    verification stays lossless.
    """

    uses_hidden_states = True

    def __init__(self, drafter: BlockDraftBackend):
        self.drafter = drafter
        self.draft_tokens = drafter.block_size - 1

    def reset(self) -> None:
        self.drafter.reset()

    def propose(self, tokens: list[int], k: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> tuple[list[int], torch.Tensor | None]:
        if self.drafter.context_length == 0 or k == 0:
            return [], None  # the prefill forward has no features to draft from yet
        logits = self.drafter.draft(tokens[-1], len(tokens) - 1)[:k]
        if sampling.greedy:
            return logits.argmax(-1).tolist(), None
        q = warp_probs(logits, sampling)
        return torch.multinomial(q, 1, generator=generator).squeeze(-1).tolist(), q

    def observe(self, hidden_states, first_position, count) -> None:
        self.drafter.extend(hidden_states, first_position, count)
