"""The AR drafter as an ONNX graph: one decode call with a flat KV cache, and its parity checks.

`(input_ids, position_ids, past_key.0, past_value.0, ...) -> (logits, present_key.0, ...)`. The
decoding check feeds each runtime its *own* previous cache (ONNX Runtime gets the `present_*` it
returned), so error that compounds through the exported cache shows up; both sides get the same
next token (PyTorch's argmax) so the two paths stay comparable step by step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import onnxruntime as ort
import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from pipeline.config.export_config import ProfileConfig
from pipeline.drafters.ar.model import load_drafter
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


def io_spec(config, dtype: str = "float32") -> IOSpec:
    layers = config.num_hidden_layers
    kv_heads = config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    inputs = [TensorSpec("input_ids", "int64", (BATCH, SEQ)), TensorSpec("position_ids", "int64", (BATCH, SEQ))]
    inputs += kv_tensors(kv_names(layers, "past"), dtype, kv_heads, PAST, head_dim)
    outputs = [TensorSpec("logits", dtype, (BATCH, SEQ, config.vocab_size))]
    outputs += kv_tensors(kv_names(layers, "present"), dtype, kv_heads, TOTAL, head_dim)
    sizes = {"num_layers": layers, "num_key_value_heads": kv_heads, "head_dim": head_dim,
             "vocab_size": config.vocab_size}
    return IOSpec(tuple(inputs), tuple(outputs), sizes)


class ARDecodeWrapper(nn.Module):
    """The new tokens sit right after the `past` cached ones, so the causal mask is built here from the
    shapes alone and handed to the model pre-made (a mask dict skips transformers' mask builders,
    which do not export cleanly). The cache object lives only inside this forward.
    """

    def __init__(self, model: PreTrainedModel):
        super().__init__()
        model.config._attn_implementation = "eager"  # plain matmul/softmax: exports everywhere
        self.model = model
        self.num_layers = model.config.num_hidden_layers

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, *past: torch.Tensor):
        cache = DynamicCache(config=self.model.config)
        for layer in range(self.num_layers):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        new, cached = input_ids.shape[1], past[0].shape[2]
        query_pos = torch.arange(new, device=input_ids.device).unsqueeze(1) + cached
        key_pos = torch.arange(cached + new, device=input_ids.device).unsqueeze(0)
        dtype = past[0].dtype
        mask = torch.where(key_pos <= query_pos, torch.tensor(0.0, dtype=dtype),
                           torch.tensor(torch.finfo(dtype).min, dtype=dtype))[None, None]
        out = self.model(input_ids=input_ids, position_ids=position_ids,
                         attention_mask={"full_attention": mask}, cache=cache, use_cache=True)
        present: list[torch.Tensor] = []
        for layer in out.cache.layers:
            present += [layer.keys, layer.values]
        return (out.logits, *present)


def feeds(spec: IOSpec, input_ids, past: Sequence) -> dict[str, np.ndarray]:
    """Named inputs for `input_ids` (B, S) appended after the cached `past` (one array per kv input)."""
    batch, new = input_ids.shape
    cached = past[0].shape[2]
    positions = np.broadcast_to(np.arange(cached, cached + new, dtype=np.int64), (batch, new)).copy()
    named = {"input_ids": np.asarray(input_ids, dtype=np.int64), "position_ids": positions}
    named.update(zip(spec.kv_input_names, (np.asarray(t, dtype=np.float32) for t in past)))
    return named


def random_feeds(spec: IOSpec, batch: int, new: int, cached: int, generator: torch.Generator) -> dict:
    ids = torch.randint(0, spec.sizes["vocab_size"], (batch, new), generator=generator)
    return feeds(spec, ids, list(random_kv(spec, batch, cached, generator).values()))


def parity(wrapper: nn.Module, session: ort.InferenceSession, spec: IOSpec, prompts: Sequence[Sequence[int]],
           steps: int, atol: float, rtol: float, seed: int = 0) -> ParityReport:
    report = ParityReport(atol, rtol)
    generator = torch.Generator().manual_seed(seed)
    for batch, new, cached in ((1, 1, 0), (2, 5, 7), (3, 1, 16)):
        case = random_feeds(spec, batch, new, cached, generator)
        report.add(f"random b{batch} s{new} past{cached}", spec.output_names, run_wrapper(wrapper, spec, case),
                   run_session(session, spec, case))
    agree = total = 0
    for index, prompt in enumerate(prompts):
        ids = np.asarray([list(prompt)])
        torch_past, ort_past = empty_kv(spec, 1), empty_kv(spec, 1)
        for step in range(steps + 1):  # step 0 is the prefill
            reference = run_wrapper(wrapper, spec, feeds(spec, ids, torch_past))
            candidate = run_session(session, spec, feeds(spec, ids, ort_past))
            report.add(f"prompt {index} {'prefill' if step == 0 else f'decode {step}'}", spec.output_names,
                       reference, candidate)
            next_token = int(reference[0][0, -1].argmax())
            agree += int(candidate[0][0, -1].argmax() == next_token)
            total += 1
            torch_past, ort_past = reference[1:], candidate[1:]
            ids = np.asarray([[next_token]])
    report.decode = {"prompts": len(prompts), "steps": steps, "argmax_agreement": agree / max(1, total)}
    return report


def export(job: OnnxJob) -> OnnxExport:
    """The served checkpoint (as serving stacks load it) to ONNX, checked against PyTorch."""
    model = load_drafter(job.serving_dir).float()
    spec = io_spec(model.config)
    wrapper = ARDecodeWrapper(model).eval()
    example = random_feeds(spec, 2, 3, 5, torch.Generator().manual_seed(job.seed))
    path = export_onnx(wrapper, spec, example, job.out, job.config.opset, job.config.exporter)
    report = parity(wrapper, ort_session(path), spec, [prompt for prompt, _ in job.texts], job.config.parity_steps,
                    job.config.atol, job.config.rtol, job.seed)
    return OnnxExport(wrapper, spec, path, report)


def opt_feeds(spec: IOSpec, profile: ProfileConfig, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    batch, new, cached = max(1, profile.batch[1]), max(1, profile.seq[1]), max(1, profile.past[1])
    return {name: torch.as_tensor(value) for name, value in random_feeds(spec, batch, new, cached, generator).items()}


# --------------------------------------------------------------------------- ONNX Runtime drafter


class OnnxARDrafter:
    """`ARDraftBackend` over an exported AR drafter; the cache is the list of `present_*` arrays."""

    name = "onnx"

    def __init__(self, session: ort.InferenceSession, spec: IOSpec):
        self.session = session
        self.spec = spec
        self.cache: list[np.ndarray] = []
        self.reset()

    @property
    def cache_length(self) -> int:
        return int(self.cache[0].shape[2])

    def reset(self) -> None:
        self.cache = empty_kv(self.spec, 1)

    def forward(self, token_ids: list[int]) -> torch.Tensor:
        named = feeds(self.spec, np.asarray([token_ids]), self.cache)
        outputs = dict(zip(self.spec.output_names, self.session.run(self.spec.output_names, named)))
        self.cache = [outputs[name] for name in self.spec.kv_output_names]
        return torch.from_numpy(np.ascontiguousarray(outputs["logits"][0, -1])).float()

    def crop(self, length: int) -> None:
        if length > self.cache_length:
            raise ValueError(f"cannot crop a cache of {self.cache_length} tokens to {length}")
        self.cache = [c[:, :, :length] for c in self.cache]


def load_onnx_drafter(export_dir: Path, providers: tuple[str, ...] = ("CPUExecutionProvider",)) -> OnnxARDrafter:
    return OnnxARDrafter(*read_export(export_dir, "ar", providers))
