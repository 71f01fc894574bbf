"""The EAGLE-3 head in the decoding loop: the head with its K/V cache (PyTorch or ONNX Runtime) and its
proposer, which drafts k tokens one by one, each step continuing from the head's own previous state."""

from __future__ import annotations

from typing import Protocol

import torch
from transformers import PreTrainedModel

from pipeline.config.sampling_config import SamplingConfig
from pipeline.drafters.eagle3.model import Eagle3Cache, Eagle3DraftModel
from pipeline.sampling import sample, warp_probs


class Eagle3HeadBackend(Protocol):
    """What `Eagle3Proposer` drives: `TorchEagle3Head` here, or the ONNX Runtime head (`eagle3/onnx.py`)."""

    def reset(self) -> None: ...

    @property
    def cache_length(self) -> int: ...

    def crop(self, length: int) -> None: ...

    def fuse(self, hidden_states: tuple[torch.Tensor | None, ...], count: int) -> torch.Tensor: ...

    def run(self, hidden: torch.Tensor, token_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]: ...


class TorchEagle3Head:
    """`run` appends positions to the cache and returns their pre-norm states and verifier-vocabulary logits."""

    name = "torch"

    def __init__(self, model: Eagle3DraftModel, verifier: PreTrainedModel):
        self.model = model
        self.embed_tokens = verifier.get_input_embeddings()
        self.cache = Eagle3Cache()

    def reset(self) -> None:
        self.cache = Eagle3Cache()

    @property
    def cache_length(self) -> int:
        return self.cache.length

    def crop(self, length: int) -> None:
        self.cache.crop(length)

    @torch.inference_mode()
    def fuse(self, hidden_states: tuple[torch.Tensor | None, ...], count: int) -> torch.Tensor:
        return self.model.fc(self.model.aux_hidden(tuple(None if h is None else h[:, :count] for h in hidden_states)))

    @torch.inference_mode()
    def run(self, hidden: torch.Tensor, token_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.tensor([token_ids], device=self.model.fc.weight.device)
        state = self.model.step(self.cache, hidden, ids, self.cache.length, self.embed_tokens)
        return state, self.model.full_vocab_logits(self.model.logits(state))


class Eagle3Proposer:
    """Position t of the head needs the verifier's features of t and the token at t+1, so `observe`
    only holds the new features; `propose`, which knows the committed tokens, runs them into the cache
    (which then covers every committed position but the last token, like the verifier's KV cache), and
    drafts from there. Draft positions are cropped from the cache afterwards: the next verifier step
    replaces them with the verifier's own features.

    Greedy: the argmax of each step (q one-hot). Sampled: draft i is drawn from its warped
    distribution q_i given drafts < i, and q is returned for rejection sampling (verification stays
    lossless). A reduced draft vocabulary puts zero probability off it.
    """

    uses_hidden_states = True

    def __init__(self, head: Eagle3HeadBackend, draft_tokens: int):
        self.head = head
        self.draft_tokens = draft_tokens
        self.reset()

    def reset(self) -> None:
        self.head.reset()
        self.pending: list[torch.Tensor] = []
        self.pending_start = 0
        self.last: tuple[torch.Tensor, torch.Tensor] | None = None  # last committed position's (state, logits)

    def observe(self, hidden_states: tuple[torch.Tensor, ...], first_position: int, count: int) -> None:
        if count == 0:
            return
        if not self.pending:
            self.pending_start = first_position
        assert first_position == self.pending_start + sum(p.shape[1] for p in self.pending), \
            "verifier features must stay contiguous"
        self.pending.append(self.head.fuse(hidden_states, count))

    def propose(self, tokens: list[int], k: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> tuple[list[int], torch.Tensor | None]:
        if k == 0 or (not self.pending and self.last is None):
            return [], None  # the prefill forward has no features to draft from yet
        if self.pending:
            start, hidden = self.pending_start, torch.cat(self.pending, dim=1)
            next_tokens = tokens[start + 1: start + 1 + hidden.shape[1]]
            assert len(next_tokens) == hidden.shape[1], "every committed position has its next token"
            state, logits = self.head.run(hidden, next_tokens)
            self.last = state[:, -1:], logits[0, -1]
            self.pending = []
        committed = self.head.cache_length
        assert committed == len(tokens) - 1, "the head covers every committed position but the last token"
        state, logits = self.last
        drafts: list[int] = []
        probs: list[torch.Tensor] = []
        for i in range(k):
            if sampling.greedy:
                token = int(logits.argmax())
            else:
                q = warp_probs(logits, sampling)
                token = sample(q, generator)
                probs.append(q)
            drafts.append(token)
            if i + 1 < k:
                state, step_logits = self.head.run(state, [token])
                logits = step_logits[0, -1]
        self.head.crop(committed)
        return drafts, torch.stack(probs) if probs else None
