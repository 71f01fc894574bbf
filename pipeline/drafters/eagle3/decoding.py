"""The EAGLE-3 head in the decoding loop: its K/V cache over committed positions and its proposer,
which drafts k tokens one by one, each step continuing from the head's own previous state."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from pipeline.config import SamplingConfig
from pipeline.drafters.eagle3.model import Eagle3Cache, Eagle3DraftModel
from pipeline.sampling import warp_probs


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

    def __init__(self, model: Eagle3DraftModel, verifier: PreTrainedModel, draft_tokens: int):
        self.model = model
        self.embed_tokens = verifier.get_input_embeddings()
        self.draft_tokens = draft_tokens
        self.reset()

    def reset(self) -> None:
        self.cache = Eagle3Cache()
        self.pending: list[torch.Tensor] = []
        self.pending_start = 0
        self.last_state: torch.Tensor | None = None  # (1, 1, D): the last committed position's pre-norm state

    @torch.inference_mode()
    def observe(self, hidden_states: tuple[torch.Tensor, ...], first_position: int, count: int) -> None:
        if count == 0:
            return
        if not self.pending:
            self.pending_start = first_position
        assert first_position == self.pending_start + sum(p.shape[1] for p in self.pending), \
            "verifier features must stay contiguous"
        self.pending.append(self.model.fc(self.model.aux_hidden(tuple(
            None if h is None else h[:, :count] for h in hidden_states))))

    @torch.inference_mode()
    def propose(self, tokens: list[int], k: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> tuple[list[int], torch.Tensor | None]:
        if k == 0 or (not self.pending and self.cache.length == 0):
            return [], None  # the prefill forward has no features to draft from yet
        device = self.model.fc.weight.device
        if self.pending:
            start = self.pending_start
            hidden = torch.cat(self.pending, dim=1)
            next_tokens = torch.tensor([tokens[start + 1: start + 1 + hidden.shape[1]]], device=device)
            assert next_tokens.shape[1] == hidden.shape[1], "every committed position has its next token"
            state = self.model.step(self.cache, hidden, next_tokens, start, self.embed_tokens)[:, -1:]
            self.pending = []
            self.last_state = state
        committed = self.cache.length
        assert committed == len(tokens) - 1, "the head covers every committed position but the last token"
        state = self.last_state
        assert state is not None
        drafts: list[int] = []
        probs: list[torch.Tensor] = []
        for i in range(k):
            logits = self.model.full_vocab_logits(self.model.logits(state)[0, -1])
            if sampling.greedy:
                token = int(logits.argmax())
            else:
                q = warp_probs(logits, sampling)
                token = int(torch.multinomial(q, 1, generator=generator))
                probs.append(q)
            drafts.append(token)
            if i + 1 < k:
                state = self.model.step(self.cache, state, torch.tensor([[token]], device=device),
                                        committed + i, self.embed_tokens)
        self.cache.crop(committed)
        return drafts, torch.stack(probs) if probs else None
