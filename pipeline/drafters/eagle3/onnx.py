"""The EAGLE-3 head as an ONNX graph: one step with a flat K/V cache, and its parity checks.

`(hidden, input_ids, past_key.0, past_value.0) -> (logits, state, present_key.0, present_value.0)`:
positions right after the cached ones, `hidden` the fused verifier features (the `fc` matmul, run
before the graph) or the previous step's `state`; `logits` over the verifier's vocabulary (−inf off a
reduced draft vocabulary), with the verifier's embedding inside the graph. The decoding check replays
how the proposer drives the head: a context chunk, then draft steps fed their own `state` back,
each runtime getting its *own* previous cache; both get PyTorch's argmax as the next token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

from pipeline.config.export_config import ProfileConfig
from pipeline.drafters.eagle3.model import Eagle3DraftModel, load_drafter
from pipeline.drafters.interface import OnnxExport, OnnxJob
from pipeline.drafters.onnx_io import (
    BATCH,
    PAST,
    SEQ,
    TOTAL,
    IOSpec,
    ParityReport,
    TensorSpec,
    empty_kv,
    export_onnx,
    kv_names,
    kv_tensors,
    ort_session,
    random_kv,
    read_export,
    run_session,
    run_wrapper,
)


def io_spec(model: Eagle3DraftModel) -> IOSpec:
    config = model.config
    kv_heads, head_dim, hidden, vocab = (config.num_key_value_heads, config.head_dim, config.hidden_size,
                                         config.vocab_size)
    inputs = [TensorSpec("hidden", "float32", (BATCH, SEQ, hidden)), TensorSpec("input_ids", "int64", (BATCH, SEQ))]
    inputs += kv_tensors(kv_names(1, "past"), "float32", kv_heads, PAST, head_dim)
    outputs = [TensorSpec("logits", "float32", (BATCH, SEQ, vocab)), TensorSpec("state", "float32", (BATCH, SEQ, hidden))]
    outputs += kv_tensors(kv_names(1, "present"), "float32", kv_heads, TOTAL, head_dim)
    sizes = {"num_layers": 1, "num_key_value_heads": kv_heads, "head_dim": head_dim, "vocab_size": vocab,
             "hidden_size": hidden}
    return IOSpec(tuple(inputs), tuple(outputs), sizes)


class Eagle3StepWrapper(nn.Module):
    def __init__(self, model: Eagle3DraftModel, embed_tokens: nn.Module):
        super().__init__()
        self.model = model
        self.embed_tokens = embed_tokens

    def forward(self, hidden: torch.Tensor, input_ids: torch.Tensor, *past: torch.Tensor):
        state, keys, values = self.model.decode_step(hidden, self.embed_tokens(input_ids), past[0], past[1])
        return self.model.full_vocab_logits(self.model.logits(state)), state, keys, values


def feeds(spec: IOSpec, hidden, input_ids, past: Sequence) -> dict[str, np.ndarray]:
    named = {"hidden": np.asarray(hidden, dtype=np.float32), "input_ids": np.asarray(input_ids, dtype=np.int64)}
    named.update(zip(spec.kv_input_names, (np.asarray(t, dtype=np.float32) for t in past)))
    return named


def empty_past(spec: IOSpec) -> list[np.ndarray]:
    return empty_kv(spec, 1)


def random_feeds(spec: IOSpec, batch: int, new: int, cached: int, generator: torch.Generator) -> dict:
    hidden = torch.randn(batch, new, spec.sizes["hidden_size"], generator=generator)
    ids = torch.randint(0, spec.sizes["vocab_size"], (batch, new), generator=generator)
    return feeds(spec, hidden, ids, list(random_kv(spec, batch, cached, generator).values()))


def parity(wrapper: Eagle3StepWrapper, session: ort.InferenceSession, spec: IOSpec,
           texts: Sequence[tuple[torch.Tensor, Sequence[int]]], steps: int, atol: float, rtol: float,
           seed: int = 0) -> ParityReport:
    """`texts`: (fused verifier features (1, T, D), the T token ids they came from) per corpus text."""
    report = ParityReport(atol, rtol)
    generator = torch.Generator().manual_seed(seed)
    for batch, new, cached in ((1, 1, 0), (2, 5, 7), (3, 1, 16)):
        case = random_feeds(spec, batch, new, cached, generator)
        report.add(f"random b{batch} s{new} past{cached}", spec.output_names, run_wrapper(wrapper, spec, case),
                   run_session(session, spec, case))
    agree = total = 0
    for index, (features, token_ids) in enumerate(texts):
        context = max(1, min(len(token_ids) - 1, len(token_ids) // 2))
        hidden, ids = features[:, :context].numpy(), np.asarray([token_ids[1: context + 1]])
        torch_past, ort_past = empty_past(spec), empty_past(spec)
        torch_hidden = ort_hidden = hidden
        for step in range(steps + 1):  # step 0 runs the committed context, then the head drafts on itself
            reference = run_wrapper(wrapper, spec, feeds(spec, torch_hidden, ids, torch_past))
            candidate = run_session(session, spec, feeds(spec, ort_hidden, ids, ort_past))
            report.add(f"text {index} {'context' if step == 0 else f'draft {step}'}", spec.output_names,
                       reference, candidate)
            next_token = int(reference[0][0, -1].argmax())
            agree += int(candidate[0][0, -1].argmax() == next_token)
            total += 1
            torch_past, ort_past = reference[2:], candidate[2:]
            torch_hidden, ort_hidden = reference[1][:, -1:], candidate[1][:, -1:]
            ids = np.asarray([[next_token]])
    report.decode = {"texts": len(texts), "steps": steps, "argmax_agreement": agree / max(1, total)}
    return report


def export(job: OnnxJob) -> OnnxExport:
    """The trained head with the verifier's embedding to ONNX, checked against PyTorch."""
    model = load_drafter(job.drafter_dir).float()
    spec = io_spec(model)
    wrapper = Eagle3StepWrapper(model, job.verifier.get_input_embeddings()).eval()
    example = random_feeds(spec, 2, 3, 5, torch.Generator().manual_seed(job.seed))
    path = export_onnx(wrapper, spec, example, job.out, job.config.opset, job.config.exporter)
    texts = []
    with torch.no_grad():
        for prompt, response in job.texts:
            ids = prompt + response
            hidden = job.verifier(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
            texts.append((model.fc(model.aux_hidden(hidden)), ids))
    report = parity(wrapper, ort_session(path), spec, texts, job.config.parity_steps, job.config.atol,
                    job.config.rtol, job.seed)
    return OnnxExport(wrapper, spec, path, report)


def opt_feeds(spec: IOSpec, profile: ProfileConfig, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    batch, new, cached = max(1, profile.batch[1]), max(1, profile.seq[1]), max(1, profile.past[1])
    return {name: torch.as_tensor(value) for name, value in random_feeds(spec, batch, new, cached, generator).items()}


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
        self.past = empty_past(self.spec)

    @property
    def length(self) -> int:
        return int(self.past[0].shape[2])

    def crop(self, length: int) -> None:
        self.past = [t[:, :, :length] for t in self.past]

    @torch.inference_mode()
    def fuse(self, hidden_states: tuple[torch.Tensor | None, ...], count: int) -> torch.Tensor:
        aux = self.fuser.aux_hidden(tuple(None if h is None else h[:, :count].cpu() for h in hidden_states))
        return self.fuser.fc(aux).float()

    def run(self, hidden: torch.Tensor, token_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        named = feeds(self.spec, hidden.float().cpu().numpy(), np.asarray([token_ids]), self.past)
        outputs = dict(zip(self.spec.output_names, self.session.run(self.spec.output_names, named)))
        self.past = [outputs[name] for name in self.spec.kv_output_names]
        return torch.from_numpy(outputs["state"]), torch.from_numpy(outputs["logits"])


def load_onnx_head(export_dir: Path, providers: tuple[str, ...] = ("CPUExecutionProvider",)) -> OnnxEagle3Head:
    session, spec = read_export(export_dir, "eagle3", providers)
    return OnnxEagle3Head(session, spec, load_drafter(Path(export_dir) / "serving"))
