"""The AR drafter as an ONNX graph: one decode call with a flat KV cache, and its parity checks.

`(input_ids, position_ids, past_key.0, past_value.0, ...) -> (logits, present_key.0, ...)`. The
decoding check replays a greedy decode of each prompt (`onnx_parity.replay_decode`), each runtime fed
the `present_*` cache it returned.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import onnxruntime as ort
import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from pipeline.drafters.ar.model import load_drafter
from pipeline.drafters.interface import OnnxJob
from pipeline.drafters.onnx_io import ParityReport, named_outputs, read_export, run_session
from pipeline.drafters.onnx_parity import random_cases, replay_decode
from pipeline.drafters.onnx_spec import BATCH, SEQ, IOSpec, TensorSpec, empty_kv, kv_cache, present_kv, random_kv, with_past


def io_spec(config, dtype: str = "float32") -> IOSpec:
    layers = config.num_hidden_layers
    kv_heads = config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    past, present, cache_sizes = kv_cache(layers, dtype, kv_heads, head_dim)
    inputs = [TensorSpec("input_ids", "int64", (BATCH, SEQ)), TensorSpec("position_ids", "int64", (BATCH, SEQ)), *past]
    outputs = [TensorSpec("logits", dtype, (BATCH, SEQ, config.vocab_size)), *present]
    return IOSpec(tuple(inputs), tuple(outputs), {**cache_sizes, "vocab_size": config.vocab_size})


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
    return with_past(spec, {"input_ids": np.asarray(input_ids, dtype=np.int64), "position_ids": positions}, past)


def random_feeds(spec: IOSpec, batch: int, new: int, cached: int, generator: torch.Generator) -> dict[str, np.ndarray]:
    ids = torch.randint(0, spec.sizes["vocab_size"], (batch, new), generator=generator)
    return feeds(spec, ids, list(random_kv(spec, batch, cached, generator).values()))


def graph(job: OnnxJob) -> tuple[nn.Module, IOSpec]:
    """The served checkpoint, as serving stacks load it."""
    model = load_drafter(job.serving_dir).float()
    return ARDecodeWrapper(model).eval(), io_spec(model.config)


def parity(job: OnnxJob, wrapper: nn.Module, session: ort.InferenceSession, spec: IOSpec) -> ParityReport:
    """Random cases, then a greedy decode of each prompt: its prefill and `parity_steps` one-token calls."""
    report = ParityReport(job.config.atol, job.config.rtol)
    random_cases(report, spec, wrapper, session, random_feeds, torch.Generator().manual_seed(job.seed))
    prompts, steps = [prompt for prompt, _ in job.texts], job.config.parity_steps

    def follow(outputs: dict[str, np.ndarray], token: int) -> dict[str, np.ndarray]:
        return feeds(spec, np.asarray([[token]]), present_kv(spec, outputs))

    agree = sum(replay_decode(report, spec, wrapper, session, feeds(spec, np.asarray([list(prompt)]), empty_kv(spec, 1)),
                              follow, steps, f"prompt {index}", ("prefill", "decode"))
                for index, prompt in enumerate(prompts))
    report.decode = {"prompts": len(prompts), "steps": steps,
                     "argmax_agreement": agree / max(1, len(prompts) * (steps + 1))}
    return report


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
        outputs = named_outputs(self.spec, run_session(self.session, self.spec,
                                                       feeds(self.spec, np.asarray([token_ids]), self.cache)))
        self.cache = present_kv(self.spec, outputs)
        return torch.from_numpy(np.ascontiguousarray(outputs["logits"][0, -1])).float()

    def crop(self, length: int) -> None:
        if length > self.cache_length:
            raise ValueError(f"cannot crop a cache of {self.cache_length} tokens to {length}")
        self.cache = [c[:, :, :length] for c in self.cache]


def load_onnx_drafter(export_dir: Path, providers: tuple[str, ...] = ("CPUExecutionProvider",)) -> OnnxARDrafter:
    return OnnxARDrafter(*read_export(export_dir, "ar", providers))
