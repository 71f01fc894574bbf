"""TensorRT engines from the exported ONNX, with the `tensorrt` Python API.

builder → network → OnnxParser → one optimisation profile covering every dynamic input (min/opt/max
from params.export.profile) → workspace limit → serialized `engine.plan`, then one run against ONNX
Runtime. Precision: TensorRT 11 networks are always strongly typed (the FP16/BF16 builder flags are
gone), so reduced precision means an ONNX graph exported in that dtype; on TensorRT 10 the fp32
graph is built with the FP16/BF16 flag instead. The pure parts (availability, profile shapes,
precision plan) import nothing from TensorRT so they are testable anywhere.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.config.export_config import ExportConfig, ProfileConfig
from pipeline.drafters.onnx_spec import BATCH, PAST, SEQ, IOSpec
from pipeline.errors import DraftlineError

ENGINE_NAME = "engine.plan"
Shape = tuple[int, ...]


def tensorrt_unavailable_reason() -> str | None:
    """Why an engine cannot be built here, or None when it can."""
    if importlib.util.find_spec("tensorrt") is None:
        return "the `tensorrt` Python package is not installed"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device is available"
    return None


def check_tensorrt_mode(config: ExportConfig) -> str | None:
    """The skip reason for the manifest (None: build). `required` without TensorRT is a user error."""
    if config.tensorrt == "off":
        return "export.tensorrt is 'off'"
    reason = tensorrt_unavailable_reason()
    if reason and config.tensorrt == "required":
        raise DraftlineError(f"export.tensorrt is 'required' but {reason}; run on a machine with an NVIDIA "
                             "GPU and `pip install tensorrt`, or set export.tensorrt: auto in params.yaml")
    return reason


# --------------------------------------------------------------------------- optimisation profiles


def axis_ranges(profile: ProfileConfig) -> dict[str, tuple[int, int, int]]:
    """min/opt/max per dynamic axis name; batch and new tokens are never empty, the cache may be."""
    return {
        BATCH: tuple(max(1, n) for n in profile.batch),
        SEQ: tuple(max(1, n) for n in profile.seq),
        PAST: profile.past,
    }


def profile_shapes(spec: IOSpec, profile: ProfileConfig) -> dict[str, tuple[Shape, Shape, Shape]]:
    """(min, opt, max) shape of every input that has a dynamic axis; static inputs are left out."""
    ranges = axis_ranges(profile)
    shapes = {}
    for tensor in spec.inputs:
        if not any(isinstance(dim, str) for dim in tensor.shape):
            continue
        unknown = [dim for dim in tensor.shape if isinstance(dim, str) and dim not in ranges]
        if unknown:
            raise DraftlineError(f"input {tensor.name} has dynamic axis {unknown[0]} without a profile range")
        shapes[tensor.name] = tuple(
            tuple(ranges[dim][i] if isinstance(dim, str) else dim for dim in tensor.shape) for i in range(3)
        )
    return shapes


# --------------------------------------------------------------------------- precision


@dataclass(frozen=True)
class PrecisionPlan:
    onnx_dtype: str  # dtype the ONNX graph must be exported in ("float32", "float16", "bfloat16")
    builder_flags: tuple[str, ...]  # names in trt.BuilderFlag to set
    strongly_typed: bool


_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
_FLAGS = {"fp16": "FP16", "bf16": "BF16"}


def precision_plan(precision: str, tensorrt_major: int) -> PrecisionPlan:
    if precision not in _DTYPES:
        raise DraftlineError(f"unknown TensorRT precision '{precision}'; use one of {sorted(_DTYPES)}")
    if tensorrt_major >= 11:
        return PrecisionPlan(_DTYPES[precision], (), True)
    if tensorrt_major < 10:
        raise DraftlineError(f"TensorRT {tensorrt_major}.x is too old; install TensorRT 10 or 11")
    flags = (_FLAGS[precision],) if precision in _FLAGS else ()
    return PrecisionPlan("float32", flags, False)


def tensorrt_version() -> str:
    import tensorrt as trt

    return trt.__version__


def tensorrt_major() -> int:
    return int(tensorrt_version().split(".")[0])


# --------------------------------------------------------------------------- build and run (needs a GPU)


def build_engine(onnx_path: Path, spec: IOSpec, config: ExportConfig, plan: PrecisionPlan, out_path: Path) -> Path:
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    if plan.strongly_typed and tensorrt_major() < 11:  # 11.x is strongly typed without asking
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise DraftlineError(f"TensorRT cannot parse {onnx_path}: {errors}")
    builder_config = builder.create_builder_config()
    builder_config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, config.trt_workspace_mb << 20)
    for flag in plan.builder_flags:
        builder_config.set_flag(getattr(trt.BuilderFlag, flag))
    profile = builder.create_optimization_profile()
    for name, (low, opt, high) in profile_shapes(spec, config.profile).items():
        profile.set_shape(name, low, opt, high)
    builder_config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, builder_config)
    if serialized is None:
        raise DraftlineError(f"TensorRT failed to build an engine from {onnx_path} (see the log above)")
    out_path.write_bytes(bytes(serialized))
    return out_path


def run_engine(engine_path: Path, spec: IOSpec, feeds: dict) -> list[np.ndarray]:
    """One synchronous run on the current CUDA device. `feeds` are tensors or arrays; floating inputs are
    cast to the engine's dtype (`spec`), outputs come back as float32 / int64 numpy arrays."""
    import tensorrt as trt
    import torch

    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(engine_path.read_bytes())
    context = engine.create_execution_context()
    keep = []  # device buffers must outlive the run
    for tensor_spec in spec.inputs:
        tensor = torch.as_tensor(feeds[tensor_spec.name]).to("cuda", getattr(torch, tensor_spec.dtype)).contiguous()
        keep.append(tensor)
        context.set_input_shape(tensor_spec.name, tuple(tensor.shape))
        context.set_tensor_address(tensor_spec.name, tensor.data_ptr())
    outputs = []
    for tensor_spec in spec.outputs:
        shape = tuple(context.get_tensor_shape(tensor_spec.name))
        out = torch.empty(shape, dtype=getattr(torch, tensor_spec.dtype), device="cuda")
        outputs.append(out)
        context.set_tensor_address(tensor_spec.name, out.data_ptr())
    stream = torch.cuda.current_stream()
    if not context.execute_async_v3(stream.cuda_stream):
        raise DraftlineError(f"TensorRT engine {engine_path} failed to run")
    stream.synchronize()
    return [(out.float() if out.is_floating_point() else out).cpu().numpy() for out in outputs]
