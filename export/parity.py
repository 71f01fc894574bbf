"""ONNX Runtime against PyTorch: random and corpus inputs, plus multi-step decoding.

The AR decoding check feeds each runtime its *own* previous KV cache (ORT gets the `present_*`
tensors ORT returned), so error that compounds through the exported cache shows up; both sides are
fed the same next token (PyTorch's argmax) so the two paths stay comparable step by step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

from export.onnx_export import IOSpec

Prompt = Sequence[int]


def error_stats(reference: np.ndarray, candidate: np.ndarray, atol: float, rtol: float) -> dict:
    """max |a-b|, max |a-b|/|b| over elements where |b| > atol, and the np.allclose verdict."""
    reference = reference.astype(np.float64)
    diff = np.abs(candidate.astype(np.float64) - reference)
    scale = np.abs(reference)
    significant = scale > atol
    max_rel = float((diff[significant] / scale[significant]).max()) if significant.any() else 0.0
    return {
        "max_abs": float(diff.max()) if diff.size else 0.0,
        "max_rel": max_rel,
        "passed": bool(np.all(diff <= atol + rtol * scale)),
    }


@dataclass
class ParityReport:
    atol: float
    rtol: float
    outputs: dict[str, dict] = field(default_factory=dict)  # worst case per output name
    cases: list[dict] = field(default_factory=list)
    decode: dict = field(default_factory=dict)

    def add(self, case: str, names: Sequence[str], reference: Sequence[np.ndarray],
            candidate: Sequence[np.ndarray]) -> None:
        case_stats = {"case": case, "max_abs": 0.0, "max_rel": 0.0, "passed": True}
        for name, ref, got in zip(names, reference, candidate):
            if ref.shape != got.shape:
                stats = {"max_abs": float("inf"), "max_rel": float("inf"), "passed": False}
            else:
                stats = error_stats(ref, got, self.atol, self.rtol)
            worst = self.outputs.setdefault(name, {"max_abs": 0.0, "max_rel": 0.0, "passed": True})
            worst["max_abs"] = max(worst["max_abs"], stats["max_abs"])
            worst["max_rel"] = max(worst["max_rel"], stats["max_rel"])
            worst["passed"] = worst["passed"] and stats["passed"]
            case_stats["max_abs"] = max(case_stats["max_abs"], stats["max_abs"])
            case_stats["max_rel"] = max(case_stats["max_rel"], stats["max_rel"])
            case_stats["passed"] = case_stats["passed"] and stats["passed"]
        self.cases.append(case_stats)

    @property
    def passed(self) -> bool:
        return all(case["passed"] for case in self.cases)

    def failures(self) -> list[str]:
        return [f"{name} (max abs {s['max_abs']:.3g}, max rel {s['max_rel']:.3g})"
                for name, s in self.outputs.items() if not s["passed"]]

    def to_json(self) -> dict:
        return {"atol": self.atol, "rtol": self.rtol, "passed": self.passed, "outputs": self.outputs,
                "cases": self.cases, "decode": self.decode}


def _run_both(wrapper: nn.Module, session: ort.InferenceSession, spec: IOSpec,
              feeds: dict[str, torch.Tensor]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    with torch.no_grad():
        reference = wrapper(*(feeds[name] for name in spec.input_names))
    reference = [reference] if isinstance(reference, torch.Tensor) else list(reference)
    candidate = session.run(spec.output_names, {name: feeds[name].numpy() for name in spec.input_names})
    return [r.float().numpy() for r in reference], candidate


# --------------------------------------------------------------------------- AR drafter


def ar_feeds(spec: IOSpec, input_ids: torch.Tensor, past: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    batch, new = input_ids.shape
    cached = past[0].shape[2]
    positions = (torch.arange(new) + cached).expand(batch, new).contiguous()
    feeds = {"input_ids": input_ids, "position_ids": positions}
    feeds.update(zip(spec.input_names[2:], past))
    return feeds


def empty_past(spec: IOSpec, batch: int) -> list[torch.Tensor]:
    heads, head_dim = spec.sizes["num_key_value_heads"], spec.sizes["head_dim"]
    return [torch.zeros(batch, heads, 0, head_dim) for _ in spec.input_names[2:]]


def random_past(spec: IOSpec, batch: int, length: int, generator: torch.Generator) -> list[torch.Tensor]:
    heads, head_dim = spec.sizes["num_key_value_heads"], spec.sizes["head_dim"]
    return [torch.randn(batch, heads, length, head_dim, generator=generator) for _ in spec.input_names[2:]]


def ar_parity(wrapper: nn.Module, session: ort.InferenceSession, spec: IOSpec, prompts: Sequence[Prompt],
              steps: int, atol: float, rtol: float, seed: int = 0) -> ParityReport:
    report = ParityReport(atol, rtol)
    generator = torch.Generator().manual_seed(seed)
    vocab = spec.sizes["vocab_size"]
    for batch, new, cached in ((1, 1, 0), (2, 5, 7), (3, 1, 16)):
        ids = torch.randint(0, vocab, (batch, new), generator=generator)
        feeds = ar_feeds(spec, ids, random_past(spec, batch, cached, generator))
        report.add(f"random b{batch} s{new} past{cached}", spec.output_names, *_run_both(wrapper, session, spec, feeds))
    agree = total = 0
    for index, prompt in enumerate(prompts):
        ids = torch.tensor([list(prompt)])
        torch_past, ort_past = empty_past(spec, 1), empty_past(spec, 1)
        for step in range(steps + 1):  # step 0 is the prefill
            torch_feeds, ort_feeds = ar_feeds(spec, ids, torch_past), ar_feeds(spec, ids, ort_past)
            with torch.no_grad():
                reference = [t.numpy() for t in wrapper(*(torch_feeds[n] for n in spec.input_names))]
            candidate = session.run(spec.output_names, {n: ort_feeds[n].numpy() for n in spec.input_names})
            report.add(f"prompt {index} {'prefill' if step == 0 else f'decode {step}'}", spec.output_names,
                       reference, candidate)
            next_token = int(reference[0][0, -1].argmax())
            agree += int(candidate[0][0, -1].argmax() == next_token)
            total += 1
            torch_past = [torch.from_numpy(t) for t in reference[1:]]
            ort_past = [torch.from_numpy(t) for t in candidate[1:]]
            ids = torch.tensor([[next_token]])
    report.decode = {"prompts": len(prompts), "steps": steps, "argmax_agreement": agree / max(1, total)}
    return report


# --------------------------------------------------------------------------- block drafter


@dataclass
class BlockReference:
    """PyTorch side of the block parity: the real `draft_block` over a real context cache."""

    model: nn.Module
    embed_tokens: nn.Module
    lm_head: nn.Module

    def __post_init__(self):
        self.reset()

    def reset(self) -> None:
        self.cache = self.model.new_context_cache()

    def step(self, features: torch.Tensor, positions: torch.Tensor, anchor_ids: torch.Tensor,
             anchor_positions: torch.Tensor) -> list[np.ndarray]:
        with torch.no_grad():
            self.model.extend_context(self.cache, features, positions)
            _, logits = self.model.draft_block(self.cache, anchor_ids, anchor_positions, self.embed_tokens,
                                               self.lm_head, denoise_steps=1)
        flat = [logits, self.cache.positions]
        for key, value in zip(self.cache.keys, self.cache.values):
            flat += [key, value]
        return [t.float().numpy() if t.is_floating_point() else t.numpy() for t in flat]


def block_random_feeds(spec: IOSpec, batch: int, cached: int, new: int,
                       generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random features and context K/V for `cached` past + `new` positions; the anchor follows them."""
    hidden, vocab = spec.sizes["hidden_size"], spec.sizes["vocab_size"]
    heads, head_dim = spec.sizes["num_key_value_heads"], spec.sizes["head_dim"]
    feeds = {
        "anchor_ids": torch.randint(0, vocab, (batch,), generator=generator),
        "anchor_positions": torch.full((batch,), cached + new, dtype=torch.long),
        "context_features": torch.randn(batch, new, hidden, generator=generator),
        "context_positions": (torch.arange(new) + cached).expand(batch, new).contiguous(),
        "past_context_positions": torch.arange(cached).expand(batch, cached).contiguous(),
    }
    for name in spec.input_names[5:]:
        feeds[name] = torch.randn(batch, heads, cached, head_dim, generator=generator)
    return feeds


def opt_feeds(kind: str, spec: IOSpec, profile, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random inputs at the TensorRT profile's opt shapes (batch, seq/new context, past/cached context)."""
    generator = torch.Generator().manual_seed(seed)
    batch, new, cached = max(1, profile.batch[1]), max(1, profile.seq[1]), max(1, profile.past[1])
    if kind == "ar":
        ids = torch.randint(0, spec.sizes["vocab_size"], (batch, new), generator=generator)
        return ar_feeds(spec, ids, random_past(spec, batch, cached, generator))
    return block_random_feeds(spec, batch, cached, new, generator)


def block_feeds(spec: IOSpec, features: torch.Tensor, positions: torch.Tensor, anchor_ids: torch.Tensor,
                past_positions: np.ndarray, past: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    feeds = {
        "anchor_ids": anchor_ids.numpy(),
        "anchor_positions": (positions[:, -1] + 1).numpy(),
        "context_features": features.numpy(),
        "context_positions": positions.numpy(),
        "past_context_positions": past_positions,
    }
    feeds.update(zip(spec.input_names[5:], past))
    return feeds


def empty_context(spec: IOSpec, batch: int) -> tuple[np.ndarray, list[np.ndarray]]:
    heads, head_dim = spec.sizes["num_key_value_heads"], spec.sizes["head_dim"]
    return (np.zeros((batch, 0), dtype=np.int64),
            [np.zeros((batch, heads, 0, head_dim), dtype=np.float32) for _ in spec.input_names[5:]])


def _chunks(total: int, steps: int, prefill: int) -> list[tuple[int, int]]:
    """Context growth of a decoding replay: a prefill, then 1-2 committed positions per step, while
    a next token remains to serve as the anchor."""
    spans, start, end = [], 0, min(prefill, total - 1)
    while end <= total - 1 and len(spans) < steps + 1:
        spans.append((start, end))
        start, end = end, end + 1 + len(spans) % 2
    return spans


def block_parity(reference: BlockReference, session: ort.InferenceSession, spec: IOSpec,
                 texts: Sequence[tuple[torch.Tensor, Prompt]], steps: int, atol: float, rtol: float,
                 seed: int = 0) -> ParityReport:
    """`texts`: (fused verifier features (1, T, D), the T token ids they came from) per corpus text.

    Random cases draft once after a random context; decoding replays each text, growing the context
    by 1-3 committed positions per step and feeding ONNX Runtime its own `present_context_*` back,
    the way the DFlash loop grows its context cache. Anchor = the token right after the context.
    """
    report = ParityReport(atol, rtol)
    generator = torch.Generator().manual_seed(seed)
    vocab, hidden = spec.sizes["vocab_size"], spec.sizes["hidden_size"]
    for batch, cached, new in ((1, 0, 1), (2, 6, 3), (3, 17, 1)):
        reference.reset()
        past_positions, past = empty_context(spec, batch)
        if cached:
            features = torch.randn(batch, cached, hidden, generator=generator)
            positions = torch.arange(cached).expand(batch, cached).contiguous()
            outputs = reference.step(features, positions, torch.zeros(batch, dtype=torch.long), positions[:, -1] + 1)
            past_positions, past = outputs[1], outputs[2:]
        features = torch.randn(batch, new, hidden, generator=generator)
        positions = (torch.arange(new) + cached).expand(batch, new).contiguous()
        anchors = torch.randint(0, vocab, (batch,), generator=generator)
        expected = reference.step(features, positions, anchors, positions[:, -1] + 1)
        got = session.run(spec.output_names, block_feeds(spec, features, positions, anchors, past_positions, past))
        report.add(f"random b{batch} past{cached} new{new}", spec.output_names, expected, got)
    agree = total = 0
    for index, (features, token_ids) in enumerate(texts):
        reference.reset()
        past_positions, past = empty_context(spec, 1)
        for step, (start, end) in enumerate(_chunks(len(token_ids), steps, max(1, len(token_ids) // 4))):
            if end <= start:
                continue
            chunk = features[:, start:end]
            positions = torch.arange(start, end)[None]
            anchors = torch.tensor([token_ids[end]])
            expected = reference.step(chunk, positions, anchors, positions[:, -1] + 1)
            got = session.run(spec.output_names, block_feeds(spec, chunk, positions, anchors, past_positions, past))
            report.add(f"text {index} {'prefill' if step == 0 else f'step {step}'}", spec.output_names, expected, got)
            agree += int((expected[0].argmax(-1) == got[0].argmax(-1)).all())
            total += 1
            past_positions, past = got[1], got[2:]
    report.decode = {"texts": len(texts), "steps": steps, "block_argmax_agreement": agree / max(1, total)}
    return report
