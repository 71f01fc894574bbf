"""The I/O contract of an exported drafter: named tensors, and the feeds built from it.

Serving runtimes (ONNX Runtime, TensorRT) know nothing about transformers' cache objects, so each
kind exports a thin wrapper with flat, named tensors (`pipeline/drafters/<kind>/onnx.py`); caches are
one key and one value tensor per layer, flagged `kv` in the spec. An `IOSpec` declares them once: it
drives the dynamic axes of the export (`onnx_io.py`), the parity inputs, the TensorRT profiles and the
manifest, and the ONNX backends read it back from the manifest, so no code addresses inputs by position.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

# Dynamic axis names. Their TensorRT min/opt/max come from params.export.profile (see tensorrt_build).
# For the block drafter, seq = newly committed context positions and past = cached context positions.
BATCH, SEQ, PAST, TOTAL = "batch", "seq", "past", "past_plus_seq"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name, e.g. "float32", "int64"
    shape: tuple[int | str, ...]  # ints are static, strings name a dynamic axis
    kv: bool = False  # one layer's cached keys or values: fed back from the matching output next call


@dataclass(frozen=True)
class IOSpec:
    """Inputs in the wrapper's positional order: the named inputs first, then the `kv` ones (its *past)."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    sizes: dict[str, int] = field(default_factory=dict)  # static model numbers, for the manifest

    def __post_init__(self):
        flags = [tensor.kv for tensor in self.inputs]
        if flags != sorted(flags):
            raise ValueError("kv inputs must come after the named inputs (they are the wrapper's *past)")

    @property
    def input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [spec.name for spec in self.outputs]

    @property
    def kv_input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs if spec.kv]

    @property
    def kv_output_names(self) -> list[str]:
        return [spec.name for spec in self.outputs if spec.kv]

    def to_json(self) -> dict:
        def one(spec: TensorSpec) -> dict:
            return {"name": spec.name, "dtype": spec.dtype, "shape": list(spec.shape), "kv": spec.kv}

        return {"inputs": [one(s) for s in self.inputs], "outputs": [one(s) for s in self.outputs],
                "sizes": dict(self.sizes)}

    @classmethod
    def from_json(cls, data: dict) -> "IOSpec":
        def one(item: dict) -> TensorSpec:
            return TensorSpec(item["name"], item["dtype"], tuple(item["shape"]), bool(item.get("kv", False)))

        return cls(tuple(one(i) for i in data["inputs"]), tuple(one(o) for o in data["outputs"]),
                   {k: int(v) for k, v in data.get("sizes", {}).items()})


def _kv_tensors(prefix: str, layers: int, dtype: str, heads: int, length: str, head_dim: int) -> list[TensorSpec]:
    """`{prefix}_key.0, {prefix}_value.0, {prefix}_key.1, ...`: the flat cache layout of every wrapper."""
    return [TensorSpec(f"{prefix}_{kind}.{layer}", dtype, (BATCH, heads, length, head_dim), kv=True)
            for layer in range(layers) for kind in ("key", "value")]


def kv_cache(layers: int, dtype: str, heads: int, head_dim: int, name: str = "",
             ) -> tuple[list[TensorSpec], list[TensorSpec], dict[str, int]]:
    """A flat K/V cache: its `past{name}_*` inputs, its `present{name}_*` outputs (the past plus the new
    positions) and the sizes `empty_kv` and `random_kv` read from the spec."""
    return (_kv_tensors(f"past{name}", layers, dtype, heads, PAST, head_dim),
            _kv_tensors(f"present{name}", layers, dtype, heads, TOTAL, head_dim),
            {"num_layers": layers, "num_key_value_heads": heads, "head_dim": head_dim})


def with_float_dtype(spec: IOSpec, dtype: str) -> IOSpec:
    """The same contract with every floating tensor in `dtype` (a reduced-precision graph)."""
    def cast(tensors):
        return tuple(TensorSpec(t.name, dtype if t.dtype.startswith(("float", "bfloat")) else t.dtype, t.shape, t.kv)
                     for t in tensors)

    return IOSpec(cast(spec.inputs), cast(spec.outputs), spec.sizes)


def empty_kv(spec: IOSpec, batch: int) -> list[np.ndarray]:
    """A zero-length cache for every kv input (the first call of a decode)."""
    return [np.zeros((batch, spec.sizes["num_key_value_heads"], 0, spec.sizes["head_dim"]), dtype=np.float32)
            for _ in spec.kv_input_names]


def random_kv(spec: IOSpec, batch: int, length: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    heads, head_dim = spec.sizes["num_key_value_heads"], spec.sizes["head_dim"]
    return {name: torch.randn(batch, heads, length, head_dim, generator=generator) for name in spec.kv_input_names}


def with_past(spec: IOSpec, named: dict, past: Sequence) -> dict[str, np.ndarray]:
    """The named inputs followed by the cached K/V `past` (one array per kv input, in order) as float32."""
    return {**named, **dict(zip(spec.kv_input_names, (np.asarray(t, dtype=np.float32) for t in past)))}


def present_kv(spec: IOSpec, outputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The cache one call returned (its kv outputs, by name), to feed back as the next call's past."""
    return [outputs[name] for name in spec.kv_output_names]
