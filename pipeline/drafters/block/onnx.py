"""The block drafter as an ONNX graph: one DFlash pass with a flat context cache, and its parity checks.

`(anchor_ids, anchor_positions, context_features, context_positions, past_context_positions,
past_context_key.0, past_context_value.0, ...) -> (logits (B, block_size−1, V), [hidden (B, block_size−1,
D): DSpark drafters with a confidence head only], present_context_positions, present_context_key.0, ...)`:
the newly committed positions' fused
features are projected and appended to the cached context K/V, then `[anchor, MASK...]` is drafted
by `DFlashDraftModel.block_logits` (the same pass training and `draft_block` run) with the verifier's
embedding table and LM head inside the graph. One pass per block (denoise_steps 1, the DFlash
default): the data-dependent unmasking loop does not export. A DSpark drafter's Markov and confidence heads
are not in the graph: they run position by position after it (`decoding.BlockProposer`), on the logits
and hidden states the graph returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

from pipeline.drafters.block.decoding import Drafted
from pipeline.drafters.block.model import DFlashDraftModel, anchor_blocks, load_drafter
from pipeline.drafters.interface import OnnxJob
from pipeline.drafters.onnx_io import ParityReport, named_outputs, read_export, run_session
from pipeline.drafters.onnx_spec import (
    BATCH,
    PAST,
    SEQ,
    TOTAL,
    IOSpec,
    TensorSpec,
    empty_kv,
    kv_cache,
    present_kv,
    random_kv,
    with_past,
)
from pipeline.errors import DraftlineError


def io_spec(model: DFlashDraftModel, vocab_size: int, dtype: str = "float32") -> IOSpec:
    config = model.config
    past, present, cache_sizes = kv_cache(config.num_hidden_layers, dtype, config.num_key_value_heads,
                                          config.head_dim, "_context")
    inputs = [
        TensorSpec("anchor_ids", "int64", (BATCH,)),
        TensorSpec("anchor_positions", "int64", (BATCH,)),
        TensorSpec("context_features", dtype, (BATCH, SEQ, config.hidden_size)),
        TensorSpec("context_positions", "int64", (BATCH, SEQ)),
        TensorSpec("past_context_positions", "int64", (BATCH, PAST)),
        *past,
    ]
    block = int(config.block_size) - 1
    outputs = [
        TensorSpec("logits", dtype, (BATCH, block, vocab_size)),
        *([TensorSpec("hidden", dtype, (BATCH, block, config.hidden_size))] if config.enable_confidence_head else []),
        TensorSpec("present_context_positions", "int64", (BATCH, TOTAL)),
        *present,
    ]
    sizes = {"block_size": int(config.block_size), "hidden_size": config.hidden_size, "vocab_size": vocab_size,
             **cache_sizes}
    return IOSpec(tuple(inputs), tuple(outputs), sizes)


class BlockDraftWrapper(nn.Module):
    def __init__(self, model: DFlashDraftModel, embed_tokens: nn.Module, lm_head: nn.Module):
        super().__init__()
        self.model = model
        self.embed_tokens = embed_tokens
        self.lm_head = lm_head

    def forward(self, anchor_ids, anchor_positions, context_features, context_positions, past_context_positions,
                *past: torch.Tensor):
        new = self.model.context_key_values(context_features, context_positions)
        keys = [torch.cat([past[2 * i], k], dim=2) for i, (k, _) in enumerate(new)]
        values = [torch.cat([past[2 * i + 1], v], dim=2) for i, (_, v) in enumerate(new)]
        positions_cached = torch.cat([past_context_positions, context_positions], dim=1)
        block_ids, masked = anchor_blocks(anchor_ids[:, None], self.model.block_size)
        hidden = self.model.block_logits(list(zip(keys, values)), positions_cached, None, block_ids, masked,
                                         anchor_positions[:, None], self.embed_tokens, None)[:, 0]
        present: list[torch.Tensor] = []
        for key, value in zip(keys, values):
            present += [key, value]
        return (self.lm_head(hidden), *with_hidden(self.model, hidden), positions_cached, *present)


def with_hidden(model: DFlashDraftModel, hidden: torch.Tensor) -> list[torch.Tensor]:
    """The `hidden` output, for drafters whose confidence head reads it."""
    return [hidden] if model.confidence_head is not None else []


@dataclass
class BlockReference:
    """PyTorch side of the parity: the real `draft_block` over a real context cache."""

    model: DFlashDraftModel
    embed_tokens: nn.Module
    lm_head: nn.Module

    def __post_init__(self):
        self.reset()

    def reset(self) -> None:
        self.cache = self.model.new_context_cache()

    def step(self, features: torch.Tensor, positions: torch.Tensor, anchor_ids: torch.Tensor) -> list[np.ndarray]:
        """Outputs in the graph's order after committing `features` at `positions` and drafting after them."""
        with torch.no_grad():
            self.model.extend_context(self.cache, features, positions)
            _, logits, hidden = self.model.draft_block(self.cache, anchor_ids, positions[:, -1] + 1, self.embed_tokens,
                                                       self.lm_head, denoise_steps=1, return_hidden=True)
        flat = [logits, *with_hidden(self.model, hidden), self.cache.positions]
        for key, value in zip(self.cache.keys, self.cache.values):
            flat += [key, value]
        return [t.float().numpy() if t.is_floating_point() else t.numpy() for t in flat]


def feeds(spec: IOSpec, features, positions, anchor_ids, past_positions, past: Sequence) -> dict[str, np.ndarray]:
    """Named inputs: commit `features` at `positions` after the cached context, draft after the last one."""
    positions = np.asarray(positions, dtype=np.int64)
    return with_past(spec, {
        "anchor_ids": np.asarray(anchor_ids, dtype=np.int64),
        "anchor_positions": positions[:, -1] + 1,
        "context_features": np.asarray(features, dtype=np.float32),
        "context_positions": positions,
        "past_context_positions": np.asarray(past_positions, dtype=np.int64),
    }, past)


def empty_context(spec: IOSpec, batch: int) -> tuple[np.ndarray, list[np.ndarray]]:
    return np.zeros((batch, 0), dtype=np.int64), empty_kv(spec, batch)


def random_feeds(spec: IOSpec, batch: int, new: int, cached: int, generator: torch.Generator) -> dict[str, np.ndarray]:
    """Random features and context K/V for `cached` past + `new` positions; the anchor follows them."""
    features = torch.randn(batch, new, spec.sizes["hidden_size"], generator=generator)
    positions = (torch.arange(new) + cached).expand(batch, new)
    anchors = torch.randint(0, spec.sizes["vocab_size"], (batch,), generator=generator)
    past_positions = torch.arange(cached).expand(batch, cached)
    return feeds(spec, features, positions, anchors, past_positions,
                 list(random_kv(spec, batch, cached, generator).values()))


def context_of(spec: IOSpec, outputs: Sequence[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """The present context positions and K/V of one call's outputs, to feed back as the next call's past."""
    named = named_outputs(spec, outputs)
    return named["present_context_positions"], present_kv(spec, named)


def _chunks(total: int, steps: int, prefill: int) -> list[tuple[int, int]]:
    """Context growth of a decoding replay: a prefill, then 1-2 committed positions per step, while
    a next token remains to serve as the anchor."""
    spans, start, end = [], 0, min(prefill, total - 1)
    while end <= total - 1 and len(spans) < steps + 1:
        spans.append((start, end))
        start, end = end, end + 1 + len(spans) % 2
    return spans


def graph(job: OnnxJob) -> tuple[nn.Module, IOSpec]:
    """The trained drafter (its own config: the served one names model_type qwen3 for the serving
    stacks) with the verifier's embedding and LM head."""
    model = load_drafter(job.drafter_dir, job.kind).float()
    wrapper = BlockDraftWrapper(model, job.verifier.get_input_embeddings(), job.verifier.get_output_embeddings())
    return wrapper.eval(), io_spec(model, job.verifier.config.get_text_config().vocab_size)


def parity(job: OnnxJob, wrapper: BlockDraftWrapper, session: ort.InferenceSession, spec: IOSpec) -> ParityReport:
    """Against `draft_block` itself (`BlockReference`), not the wrapper. Random cases draft once after a
    random context; decoding replays each corpus text (its fused verifier features), growing the
    context by 1-3 committed positions per step and feeding ONNX Runtime its own `present_context_*`
    back, the way the DFlash loop grows its context cache. Anchor = the token right after the context.
    """
    report = ParityReport(job.config.atol, job.config.rtol)
    generator = torch.Generator().manual_seed(job.seed)
    reference = BlockReference(wrapper.model, wrapper.embed_tokens, wrapper.lm_head)
    texts, steps = job.verifier_texts(wrapper.model.fuse_target_hidden), job.config.parity_steps
    vocab, hidden = spec.sizes["vocab_size"], spec.sizes["hidden_size"]
    for batch, cached, new in ((1, 0, 1), (2, 6, 3), (3, 17, 1)):
        reference.reset()
        past_positions, past = empty_context(spec, batch)
        if cached:
            positions = torch.arange(cached).expand(batch, cached)
            outputs = reference.step(torch.randn(batch, cached, hidden, generator=generator), positions,
                                     torch.zeros(batch, dtype=torch.long))
            past_positions, past = context_of(spec, outputs)
        features = torch.randn(batch, new, hidden, generator=generator)
        positions = (torch.arange(new) + cached).expand(batch, new)
        anchors = torch.randint(0, vocab, (batch,), generator=generator)
        expected = reference.step(features, positions, anchors)
        got = run_session(session, spec, feeds(spec, features, positions, anchors, past_positions, past))
        report.add(f"random b{batch} past{cached} new{new}", spec.output_names, expected, got)
    agree = total = 0
    for index, (features, token_ids) in enumerate(texts):
        reference.reset()
        past_positions, past = empty_context(spec, 1)
        for step, (start, end) in enumerate(_chunks(len(token_ids), steps, max(1, len(token_ids) // 4))):
            if end <= start:
                continue
            chunk, positions = features[:, start:end], torch.arange(start, end)[None]
            anchors = torch.tensor([token_ids[end]])
            expected = reference.step(chunk, positions, anchors)
            got = run_session(session, spec, feeds(spec, chunk, positions, anchors, past_positions, past))
            report.add(f"text {index} {'prefill' if step == 0 else f'step {step}'}", spec.output_names, expected, got)
            agree += int((expected[0].argmax(-1) == got[0].argmax(-1)).all())
            total += 1
            past_positions, past = context_of(spec, got)
    report.decode = {"texts": len(texts), "steps": steps, "block_argmax_agreement": agree / max(1, total)}
    return report


# --------------------------------------------------------------------------- ONNX Runtime drafter


class OnnxBlockDrafter:
    """The DFlash drafter on ONNX Runtime, interchangeable with `BlockDrafter` in `BlockProposer`.

    `extend` fuses the verifier's hidden states with the drafter's `fc`/`hidden_norm` (PyTorch, one
    matmul) and holds them until the next `draft`, which appends them to the cached context K/V in
    the same ONNX call that drafts the block.
    """

    def __init__(self, session: ort.InferenceSession, spec: IOSpec, fuser: DFlashDraftModel):
        self.session = session
        self.spec = spec
        self.fuser = fuser
        self.heads = fuser  # the served checkpoint's Markov / confidence heads run in PyTorch
        self.block_size = int(fuser.config.block_size)
        self.reset()

    def reset(self) -> None:
        self.positions, self.cache = empty_context(self.spec, 1)
        self.pending: list[np.ndarray] = []
        self.context_length = 0

    @torch.inference_mode()
    def extend(self, hidden_states: tuple[torch.Tensor, ...], first_position: int, count: int) -> None:
        if count == 0:
            return
        assert first_position == self.context_length, "context features must stay contiguous"
        features = self.fuser.fuse_target_hidden(tuple(h[:, :count] for h in hidden_states))
        self.pending.append(features.float().cpu().numpy())
        self.context_length += count

    def draft(self, anchor_id: int, anchor_position: int) -> Drafted:
        if not self.pending:
            raise ValueError("the ONNX block drafter needs new context features before each draft")
        features = np.concatenate(self.pending, axis=1)
        start = int(self.positions.shape[1])
        positions = np.arange(start, start + features.shape[1], dtype=np.int64)[None]
        assert positions[0, -1] + 1 == anchor_position, "the anchor follows the committed context"
        named = feeds(self.spec, features, positions, [anchor_id], self.positions, self.cache)
        outputs = named_outputs(self.spec, run_session(self.session, self.spec, named))
        self.positions, self.cache = outputs["present_context_positions"], present_kv(self.spec, outputs)
        self.pending = []
        hidden = outputs.get("hidden")
        return torch.from_numpy(outputs["logits"][0]), None if hidden is None else torch.from_numpy(hidden[0])


def load_onnx_drafter(export_dir: Path, kind: str, denoise_steps: int = 1,
                      providers: tuple[str, ...] = ("CPUExecutionProvider",)) -> OnnxBlockDrafter:
    if denoise_steps != 1:
        raise DraftlineError(f"the ONNX {kind} drafter runs one DFlash pass per block; set evaluate.denoise_steps: 1 "
                             f"(got {denoise_steps}) or evaluate.backend: torch")
    session, spec = read_export(export_dir, kind, providers)
    # the fusing projection (fc, hidden_norm) runs in PyTorch from the served checkpoint
    return OnnxBlockDrafter(session, spec, load_drafter(Path(export_dir) / "serving", kind))
