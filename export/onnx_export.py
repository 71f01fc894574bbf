"""ONNX export of the drafters through thin wrappers with explicit, flat inputs and outputs.

Serving runtimes (ONNX Runtime, TensorRT) know nothing about transformers' cache objects, so each
wrapper takes and returns plain tensors: the AR drafter gets its KV cache as one key and one value
tensor per layer and hands back the grown cache; the block drafter gets the verifier's context
features and returns the block's logits. Shapes are declared once in an `IOSpec`, which drives the
dynamic axes of the export, the parity inputs, the TensorRT profiles and the manifest.
"""

from __future__ import annotations

import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import onnx
import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from pipeline.errors import DraftlineError

ONNX_NAME = "model.onnx"
EXTERNAL_DATA_NAME = "model.onnx.data"
Exporter = Literal["dynamo", "torchscript"]

# Dynamic axis names. Their TensorRT min/opt/max come from params.export.profile (see tensorrt_build).
# For the block drafter, seq = newly committed context positions and past = cached context positions.
BATCH, SEQ, PAST, TOTAL = "batch", "seq", "past", "past_plus_seq"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name, e.g. "float32", "int64"
    shape: tuple[int | str, ...]  # ints are static, strings name a dynamic axis


@dataclass(frozen=True)
class IOSpec:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    sizes: dict[str, int] = field(default_factory=dict)  # static model numbers, for the manifest

    @property
    def input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [spec.name for spec in self.outputs]

    def to_json(self) -> dict:
        def one(spec: TensorSpec) -> dict:
            return {"name": spec.name, "dtype": spec.dtype, "shape": list(spec.shape)}

        return {"inputs": [one(s) for s in self.inputs], "outputs": [one(s) for s in self.outputs]}


def with_float_dtype(spec: IOSpec, dtype: str) -> IOSpec:
    """The same contract with every floating tensor in `dtype` (a reduced-precision graph)."""
    def cast(tensors):
        return tuple(TensorSpec(t.name, dtype if t.dtype.startswith(("float", "bfloat")) else t.dtype, t.shape)
                     for t in tensors)

    return IOSpec(cast(spec.inputs), cast(spec.outputs), spec.sizes)


# --------------------------------------------------------------------------- AR drafter


def past_names(num_layers: int, prefix: str = "past") -> list[str]:
    return [f"{prefix}_{kind}.{layer}" for layer in range(num_layers) for kind in ("key", "value")]


def ar_io_spec(config, dtype: str = "float32") -> IOSpec:
    layers = config.num_hidden_layers
    kv_heads = config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    inputs = [TensorSpec("input_ids", "int64", (BATCH, SEQ)), TensorSpec("position_ids", "int64", (BATCH, SEQ))]
    inputs += [TensorSpec(name, dtype, (BATCH, kv_heads, PAST, head_dim)) for name in past_names(layers)]
    outputs = [TensorSpec("logits", dtype, (BATCH, SEQ, config.vocab_size))]
    outputs += [TensorSpec(name, dtype, (BATCH, kv_heads, TOTAL, head_dim)) for name in past_names(layers, "present")]
    sizes = {"num_layers": layers, "num_key_value_heads": kv_heads, "head_dim": head_dim,
             "vocab_size": config.vocab_size}
    return IOSpec(tuple(inputs), tuple(outputs), sizes)


class ARDecodeWrapper(nn.Module):
    """`(input_ids, position_ids, past_key.0, past_value.0, ...) -> (logits, present_key.0, ...)`.

    The new tokens sit right after the `past` cached ones, so the causal mask is built here from the
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


# --------------------------------------------------------------------------- block drafter


def block_io_spec(model, vocab_size: int, dtype: str = "float32") -> IOSpec:
    config = model.config
    layers, kv_heads, head_dim = config.num_hidden_layers, config.num_key_value_heads, config.head_dim
    draft_len = int(config.block_size) - 1
    inputs = [
        TensorSpec("anchor_ids", "int64", (BATCH,)),
        TensorSpec("anchor_positions", "int64", (BATCH,)),
        TensorSpec("context_features", dtype, (BATCH, SEQ, config.hidden_size)),
        TensorSpec("context_positions", "int64", (BATCH, SEQ)),
        TensorSpec("past_context_positions", "int64", (BATCH, PAST)),
    ]
    inputs += [TensorSpec(name, dtype, (BATCH, kv_heads, PAST, head_dim)) for name in past_names(layers, "past_context")]
    outputs = [TensorSpec("logits", dtype, (BATCH, draft_len, vocab_size)),
               TensorSpec("present_context_positions", "int64", (BATCH, TOTAL))]
    outputs += [TensorSpec(name, dtype, (BATCH, kv_heads, TOTAL, head_dim))
                for name in past_names(layers, "present_context")]
    sizes = {"block_size": int(config.block_size), "hidden_size": config.hidden_size, "vocab_size": vocab_size,
             "num_layers": layers, "num_key_value_heads": kv_heads, "head_dim": head_dim}
    return IOSpec(tuple(inputs), tuple(outputs), sizes)


class BlockDraftWrapper(nn.Module):
    """One DFlash pass with a flat context cache.

    `(anchor_ids, anchor_positions, context_features, context_positions, past_context_positions,
    past_context_key.0, past_context_value.0, ...) -> (logits (B, block_size-1, V),
    present_context_positions, present_context_key.0, ...)`: the newly committed positions' fused
    features are projected and appended to the cached context K/V, then `[anchor, MASK...]` is
    drafted in one forward (denoise_steps=1, the DFlash default) with the verifier's embedding
    table and LM head inside the graph. Mirrors `DFlashDraftModel.draft_block`'s first pass without
    its data-dependent unmasking loop, which does not export; parity is checked against `draft_block`.
    """

    def __init__(self, model: nn.Module, embed_tokens: nn.Module, lm_head: nn.Module):
        super().__init__()
        self.model = model
        self.embed_tokens = embed_tokens
        self.lm_head = lm_head
        self.num_layers = model.config.num_hidden_layers

    def forward(self, anchor_ids, anchor_positions, context_features, context_positions, past_context_positions,
                *past: torch.Tensor):
        new = self.model.context_key_values(context_features, context_positions)
        keys = [torch.cat([past[2 * i], k], dim=2) for i, (k, _) in enumerate(new)]
        values = [torch.cat([past[2 * i + 1], v], dim=2) for i, (_, v) in enumerate(new)]
        positions_cached = torch.cat([past_context_positions, context_positions], dim=1)

        size = int(self.model.config.block_size)
        batch = anchor_ids.shape[0]
        offsets = torch.arange(size, device=anchor_ids.device)
        positions = anchor_positions[:, None] + offsets
        visible = positions_cached < anchor_positions[:, None]  # gate by position, as draft_block does
        mask = torch.cat([visible, torch.ones_like(positions, dtype=torch.bool)], dim=1)
        mask = mask[:, None, None, :].expand(batch, 1, size, mask.shape[1])
        block_ids = anchor_ids[:, None].expand(batch, size)
        masked = (offsets > 0).expand(batch, size)
        embeds = self.model.embed_block(block_ids, masked, self.embed_tokens)
        hidden = self.model.run_layers(embeds, positions, list(zip(keys, values)), mask)
        logits = self.lm_head(hidden)[:, 1:]
        present: list[torch.Tensor] = []
        for key, value in zip(keys, values):
            present += [key, value]
        return (logits, positions_cached, *present)


# --------------------------------------------------------------------------- export


def _dynamic_axes(spec: IOSpec) -> dict[str, dict[int, str]]:
    axes = {}
    for tensor in (*spec.inputs, *spec.outputs):
        dynamic = {i: dim for i, dim in enumerate(tensor.shape) if isinstance(dim, str)}
        if dynamic:
            axes[tensor.name] = dynamic
    return axes


def _dynamic_shapes(spec: IOSpec, wrapper: nn.Module) -> tuple:
    """torch.export dims per input, in positional order; *args inputs are grouped into one tuple."""
    dims: dict[str, torch.export.Dim] = {}

    def for_tensor(tensor: TensorSpec) -> dict[int, torch.export.Dim]:
        return {i: dims.setdefault(dim, torch.export.Dim(dim, min=0))
                for i, dim in enumerate(tensor.shape) if isinstance(dim, str)}

    shapes = [for_tensor(tensor) for tensor in spec.inputs]
    fixed = 2 if isinstance(wrapper, ARDecodeWrapper) else 5  # inputs before the *past varargs
    return (*shapes[:fixed], tuple(shapes[fixed:]))


def export_onnx(wrapper: nn.Module, spec: IOSpec, example: dict[str, torch.Tensor], out_dir: Path,
                opset: int, exporter: Exporter = "dynamo") -> Path:
    """Export `wrapper` to `out_dir/model.onnx` (+ `model.onnx.data`), then run `onnx.checker`."""
    args = tuple(example[name] for name in spec.input_names)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".onnx.") as tmp:
        raw = Path(tmp) / "raw.onnx"
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # tracer / deprecation chatter, not actionable for users
            try:
                if exporter == "dynamo":
                    torch.onnx.export(wrapper, args, str(raw), input_names=spec.input_names,
                                      output_names=spec.output_names, opset_version=opset,
                                      dynamic_shapes=_dynamic_shapes(spec, wrapper), dynamo=True,
                                      verbose=False)
                else:
                    torch.onnx.export(wrapper, args, str(raw), input_names=spec.input_names,
                                      output_names=spec.output_names, opset_version=opset,
                                      dynamic_axes=_dynamic_axes(spec), dynamo=False)
            except Exception as error:  # the exporters raise many types; the first line is the useful part
                first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                other = "torchscript" if exporter == "dynamo" else "dynamo"
                raise DraftlineError(f"ONNX export ({exporter}) failed: {first}; "
                                     f"try export.exporter: {other} in params.yaml") from None
        model = onnx.load(str(raw))
        path = out_dir / ONNX_NAME
        (out_dir / EXTERNAL_DATA_NAME).unlink(missing_ok=True)
        # weights go to one external file (same layout for tiny and >2 GB models); small
        # constants stay inline because shape inference in onnx.checker must read them
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=EXTERNAL_DATA_NAME, size_threshold=1024)
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except onnx.checker.ValidationError as error:
        raise DraftlineError(f"{path} fails onnx.checker ({str(error).splitlines()[0]}); "
                             "this is an exporter bug: try the other export.exporter (dynamo/torchscript)") from None
    return path

