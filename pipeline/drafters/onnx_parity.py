"""The checks every kind's ONNX export runs, and the random inputs they (and the TensorRT check) feed.

A kind's `onnx.py` supplies its I/O spec, its wrapper and `random_feeds(spec, batch, new, cached,
generator)`: named inputs for `new` positions after `cached` ones. The loops here run PyTorch and ONNX
Runtime on the same inputs and record each comparison in a `ParityReport`.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

from pipeline.config.export_config import ProfileConfig
from pipeline.drafters.onnx_io import ParityReport, named_outputs, run_session, run_wrapper
from pipeline.drafters.onnx_spec import IOSpec

RandomFeeds = Callable[[IOSpec, int, int, int, torch.Generator], dict[str, np.ndarray]]

# (batch, new, cached): a first call on an empty cache, several new positions, one after a longer cache
RANDOM_SHAPES = ((1, 1, 0), (2, 5, 7), (3, 1, 16))


def opt_feeds(random_feeds: RandomFeeds, spec: IOSpec, profile: ProfileConfig, seed: int) -> dict[str, torch.Tensor]:
    """Random inputs at the TensorRT profile's opt shapes (at least one of each, so no tensor is empty)."""
    generator = torch.Generator().manual_seed(seed)
    batch, new, cached = max(1, profile.batch[1]), max(1, profile.seq[1]), max(1, profile.past[1])
    return {name: torch.as_tensor(value) for name, value in random_feeds(spec, batch, new, cached, generator).items()}


def random_cases(report: ParityReport, spec: IOSpec, wrapper: nn.Module, session: ort.InferenceSession,
                 random_feeds: RandomFeeds, generator: torch.Generator) -> None:
    """The wrapper and the graph on the same random inputs (random cached K/V), at `RANDOM_SHAPES`."""
    for batch, new, cached in RANDOM_SHAPES:
        case = random_feeds(spec, batch, new, cached, generator)
        report.add(f"random b{batch} s{new} past{cached}", spec.output_names, run_wrapper(wrapper, spec, case),
                   run_session(session, spec, case))


def replay_decode(report: ParityReport, spec: IOSpec, wrapper: nn.Module, session: ort.InferenceSession,
                  first: dict, follow: Callable[[dict[str, np.ndarray], int], dict], steps: int,
                  case: str, phases: tuple[str, str]) -> int:
    """A greedy decode of `steps` + 1 calls replayed on both runtimes. Each is fed its *own* previous
    outputs, so error that compounds through the exported cache shows up; both get PyTorch's argmax as
    the next token, so the two paths stay comparable step by step. `first` feeds call 0, then
    `follow(outputs by name, next token)` the next one. Cases are named `{case} {phases[0]}` (call 0) and
    `{case} {phases[1]} {step}`. Returns the calls whose argmax ONNX Runtime agreed on."""
    torch_feeds = ort_feeds = first
    agree = 0
    for step in range(steps + 1):
        reference = named_outputs(spec, run_wrapper(wrapper, spec, torch_feeds))
        candidate = named_outputs(spec, run_session(session, spec, ort_feeds))
        label = f"{case} {phases[0]}" if step == 0 else f"{case} {phases[1]} {step}"
        report.add(label, spec.output_names, list(reference.values()), list(candidate.values()))
        next_token = int(reference["logits"][0, -1].argmax())
        agree += int(candidate["logits"][0, -1].argmax() == next_token)
        torch_feeds, ort_feeds = follow(reference, next_token), follow(candidate, next_token)
    return agree
