"""The block drafter in the decoding loop: the DFlash drafter with its context cache (PyTorch or ONNX
Runtime) and its proposer, which drafts block_size − 1 tokens per verifier step in one pass (the DSpark
variant then runs its Markov head over the pass's logits left to right, in PyTorch for both backends,
as vLLM runs it outside the parallel pass)."""

from __future__ import annotations

from typing import Protocol

import torch
from transformers import PreTrainedModel

from pipeline.config.sampling_config import SamplingConfig
from pipeline.drafters.block.model import DFlashDraftModel
from pipeline.errors import DraftlineError
from pipeline.sampling import draw, warp_probs

Drafted = tuple[torch.Tensor, "torch.Tensor | None"]  # block logits (block_size − 1, V), hidden states or None

# the largest Markov bias table (V × V, float32) a DSpark proposer precomputes: 16 MiB, a 2048-token vocabulary;
# larger vocabularies run the Markov head per drafted token
MARKOV_TABLE_MAX_ENTRIES = 1 << 22


class BlockDraftBackend(Protocol):
    """What `BlockProposer` drives: `BlockDrafter` here, or the ONNX Runtime drafter (`block/onnx.py`)."""

    block_size: int
    heads: DFlashDraftModel  # whose Markov / confidence heads (if any) the proposer runs in PyTorch

    def reset(self) -> None: ...

    def extend(self, hidden_states: tuple[torch.Tensor, ...], first_position: int, count: int) -> None: ...

    def draft(self, anchor_id: int, anchor_position: int) -> Drafted: ...


class BlockDrafter:
    """A `DFlashDraftModel` bound to the verifier's frozen embedding and LM head, with its context cache.

    The context cache holds projected verifier features of every committed position before the
    anchor, so its length always equals the verifier's KV-cache length.
    """

    def __init__(self, model: DFlashDraftModel, verifier: PreTrainedModel, denoise_steps: int = 1):
        if model.config.is_dspark and denoise_steps != 1:
            raise DraftlineError(f"a DSpark block drafter (markov_rank > 0) drafts one parallel pass, then its Markov "
                                 f"head left to right; set evaluate.denoise_steps: 1 (got {denoise_steps})")
        self.model = model
        self.heads = model  # the Markov / confidence heads the proposer runs
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
    def draft(self, anchor_id: int, anchor_position: int) -> Drafted:
        """Logits (block_size − 1, V) of the block after the anchor (the parallel pass, before any Markov
        bias), and its hidden states (block_size − 1, D) when a confidence head will read them."""
        device = self.embed_tokens.weight.device
        _, logits, hidden = self.model.draft_block(self.cache, torch.tensor([anchor_id], device=device),
                                                   torch.tensor([anchor_position], device=device), self.embed_tokens,
                                                   self.lm_head, denoise_steps=self.denoise_steps, return_hidden=True)
        return logits[0], hidden[0] if self.model.confidence_head is not None else None


class BlockProposer:
    """B−1 tokens per verifier step from one DFlash drafter pass over cached verifier features.

    DFlash: greedy drafts each position's argmax (q one-hot); sampled draws each position from its own
    warped distribution q_i, and q is returned for rejection sampling. The positions are drafted
    independently given the anchor, so q_i is exactly the distribution draft i came from.

    DSpark (a Markov head): left to right, position i's logits get the Markov bias of the token drafted at
    i − 1 (the anchor for i = 1) before its argmax or its draw, and q_i is that biased, warped
    distribution: the distribution draft i came from given the drafts before it, which is what rejection
    sampling needs to stay lossless. With a confidence head and `confidence_threshold` > 0 the block stops
    before the first position whose running product of predicted acceptances falls below the threshold;
    the decision reads only the drafts so far, never the verifier, so it changes the length, not the
    output distribution.
    """

    uses_hidden_states = True

    def __init__(self, drafter: BlockDraftBackend, confidence_threshold: float = 0.0):
        self.drafter = drafter
        self.draft_tokens = drafter.block_size - 1
        self.confidence_threshold = confidence_threshold
        # DSpark: every previous token's Markov bias at once, so the chain adds a row per drafted token instead
        # of running the head (0.26 -> 0.13 ms a block of 7 at T = 0.8, V = 1024, 2 cores); read at construction,
        # so a proposer drafts with the weights it was built on
        heads = drafter.heads
        vocab = heads.markov_head.markov_w1.num_embeddings if heads.markov_head is not None else 0
        with torch.no_grad():
            self.markov_table = heads.markov_bias_table() if 0 < vocab * vocab <= MARKOV_TABLE_MAX_ENTRIES else None

    def reset(self) -> None:
        self.drafter.reset()

    def propose(self, tokens: list[int], k: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> tuple[list[int], torch.Tensor | None]:
        if self.drafter.context_length == 0 or k == 0:
            return [], None  # the prefill forward has no features to draft from yet
        logits, hidden = self.drafter.draft(tokens[-1], len(tokens) - 1)
        logits = logits[:k]
        if self.drafter.heads.markov_head is not None:
            return self.markov_chain(logits, hidden, tokens[-1], sampling, generator)
        if sampling.greedy:
            return logits.argmax(-1).tolist(), None
        q = warp_probs(logits, sampling)
        return draw(q, generator).tolist(), q

    @torch.inference_mode()
    def markov_chain(self, logits: torch.Tensor, hidden: torch.Tensor | None, anchor_id: int, sampling: SamplingConfig,
                     generator: torch.Generator | None) -> tuple[list[int], torch.Tensor | None]:
        heads = self.drafter.heads
        cut = self.confidence_threshold > 0 and hidden is not None
        prev = torch.tensor(anchor_id, device=logits.device)
        drafts: list[int] = []
        probs: list[torch.Tensor] = []
        reach = 1.0
        for position in range(logits.shape[0]):
            if cut:
                reach *= float(heads.confidence_logits(hidden[position], prev).sigmoid())
                if reach < self.confidence_threshold:
                    break
            biased = (heads.markov_logits(logits[position], prev) if self.markov_table is None
                      else logits[position] + self.markov_table[prev].to(logits.dtype))
            if sampling.greedy:
                prev = biased.argmax(-1)
            else:
                q = warp_probs(biased, sampling)
                prev = draw(q, generator)
                probs.append(q)
            drafts.append(int(prev))
        if sampling.greedy or not drafts:
            return drafts, None
        return drafts, torch.stack(probs)

    def observe(self, hidden_states, first_position, count) -> None:
        self.drafter.extend(hidden_states, first_position, count)
