"""The EAGLE-3 head as an ONNX graph: one step with a flat K/V cache, and its parity checks.

`(hidden, input_ids, past_key.0, past_value.0) -> (logits, state, present_key.0, present_value.0)`:
positions right after the cached ones, `hidden` the fused verifier features (the `fc` matmul, run
before the graph) or the previous step's `state`; `logits` over the verifier's vocabulary (−inf off a
reduced draft vocabulary), with the verifier's embedding inside the graph. The decoding check replays
how the proposer drives the head: a context chunk, then draft steps fed their own `state` back
(`onnx_parity.replay_decode`: each runtime gets its *own* previous outputs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

from pipeline.drafters.eagle3.model import Eagle3DraftModel, load_drafter
from pipeline.drafters.interface import OnnxJob
from pipeline.drafters.onnx_io import ParityReport, named_outputs, read_export, run_session
from pipeline.drafters.onnx_parity import random_cases, replay_decode
from pipeline.drafters.onnx_spec import BATCH, SEQ, IOSpec, TensorSpec, empty_kv, kv_cache, present_kv, random_kv, with_past


def io_spec(model: Eagle3DraftModel) -> IOSpec:
    config = model.config
    kv_heads, head_dim, hidden, vocab = (config.num_key_value_heads, config.head_dim, config.hidden_size,
                                         config.vocab_size)
    past, present, cache_sizes = kv_cache(1, "float32", kv_heads, head_dim)
    inputs = [TensorSpec("hidden", "float32", (BATCH, SEQ, hidden)), TensorSpec("input_ids", "int64", (BATCH, SEQ)), *past]
    outputs = [TensorSpec("logits", "float32", (BATCH, SEQ, vocab)), TensorSpec("state", "float32", (BATCH, SEQ, hidden)),
               *present]
    return IOSpec(tuple(inputs), tuple(outputs), {**cache_sizes, "vocab_size": vocab, "hidden_size": hidden})


class Eagle3StepWrapper(nn.Module):
    def __init__(self, model: Eagle3DraftModel, embed_tokens: nn.Module):
        super().__init__()
        self.model = model
        self.embed_tokens = embed_tokens

    def forward(self, hidden: torch.Tensor, input_ids: torch.Tensor, *past: torch.Tensor):
        state, keys, values = self.model.decode_step(hidden, self.embed_tokens(input_ids), past[0], past[1])
        return self.model.full_vocab_logits(self.model.logits(state)), state, keys, values


def feeds(spec: IOSpec, hidden, input_ids, past: Sequence) -> dict[str, np.ndarray]:
    return with_past(spec, {"hidden": np.asarray(hidden, dtype=np.float32),
                            "input_ids": np.asarray(input_ids, dtype=np.int64)}, past)


def random_feeds(spec: IOSpec, batch: int, new: int, cached: int, generator: torch.Generator) -> dict[str, np.ndarray]:
    hidden = torch.randn(batch, new, spec.sizes["hidden_size"], generator=generator)
    ids = torch.randint(0, spec.sizes["vocab_size"], (batch, new), generator=generator)
    return feeds(spec, hidden, ids, list(random_kv(spec, batch, cached, generator).values()))


def graph(job: OnnxJob) -> tuple[nn.Module, IOSpec]:
    """The trained head with the verifier's embedding."""
    model = load_drafter(job.drafter_dir).float()
    return Eagle3StepWrapper(model, job.verifier.get_input_embeddings()).eval(), io_spec(model)


def parity(job: OnnxJob, wrapper: Eagle3StepWrapper, session: ort.InferenceSession, spec: IOSpec) -> ParityReport:
    """Random cases, then per corpus text the way the proposer drives the head: the committed context
    (the first half of the text's fused verifier features) in one call, then `parity_steps` draft
    steps, each fed its own `state` back."""
    report = ParityReport(job.config.atol, job.config.rtol)
    random_cases(report, spec, wrapper, session, random_feeds, torch.Generator().manual_seed(job.seed))
    model, steps = wrapper.model, job.config.parity_steps
    texts = job.verifier_texts(lambda hidden: model.fc(model.aux_hidden(hidden)))

    def follow(outputs: dict[str, np.ndarray], token: int) -> dict[str, np.ndarray]:
        return feeds(spec, outputs["state"][:, -1:], [[token]], present_kv(spec, outputs))

    agree = 0
    for index, (features, token_ids) in enumerate(texts):
        context = max(1, min(len(token_ids) - 1, len(token_ids) // 2))
        first = feeds(spec, features[:, :context].numpy(), [token_ids[1: context + 1]], empty_kv(spec, 1))
        agree += replay_decode(report, spec, wrapper, session, first, follow, steps, f"text {index}", ("context", "draft"))
    report.decode = {"texts": len(texts), "steps": steps,
                     "argmax_agreement": agree / max(1, len(texts) * (steps + 1))}
    return report


# --------------------------------------------------------------------------- ONNX Runtime drafter


class OnnxEagle3Head:
    """The head's step on ONNX Runtime (embedding and LM head inside the graph), interchangeable with
    `TorchEagle3Head`; the fusing `fc` (one matmul) runs in PyTorch from the served checkpoint."""

    name = "onnx"

    def __init__(self, session: ort.InferenceSession, spec: IOSpec, fuser: Eagle3DraftModel):
        self.session = session
        self.spec = spec
        self.fuser = fuser
        self.reset()

    def reset(self) -> None:
        self.past = empty_kv(self.spec, 1)

    @property
    def cache_length(self) -> int:
        return int(self.past[0].shape[2])

    def crop(self, length: int) -> None:
        self.past = [t[:, :, :length] for t in self.past]

    @torch.inference_mode()
    def fuse(self, hidden_states: tuple[torch.Tensor | None, ...], count: int) -> torch.Tensor:
        aux = self.fuser.aux_hidden(tuple(None if h is None else h[:, :count].cpu() for h in hidden_states))
        return self.fuser.fc(aux).float()

    def run(self, hidden: torch.Tensor, token_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        named = feeds(self.spec, hidden.float().cpu().numpy(), np.asarray([token_ids]), self.past)
        outputs = named_outputs(self.spec, run_session(self.session, self.spec, named))
        self.past = present_kv(self.spec, outputs)
        return torch.from_numpy(outputs["state"]), torch.from_numpy(outputs["logits"])


def load_onnx_drafter(export_dir: Path, providers: tuple[str, ...] = ("CPUExecutionProvider",)) -> OnnxEagle3Head:
    session, spec = read_export(export_dir, "eagle3", providers)
    return OnnxEagle3Head(session, spec, load_drafter(Path(export_dir) / "serving"))
