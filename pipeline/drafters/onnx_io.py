"""What every drafter kind does with ONNX: export a wrapper to a checked graph, open it in ONNX Runtime,
run it on named feeds, and compare it with PyTorch (the parity report).

The tensors' names and shapes come from the kind's `IOSpec` (`onnx_spec.py`).
"""

from __future__ import annotations

import json
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Sequence

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from pipeline.drafters.onnx_spec import IOSpec, TensorSpec
from pipeline.errors import DraftlineError, describe_os_error, os_error_behind
from pipeline.integrity import verify_manifest

ONNX_NAME = "model.onnx"
EXTERNAL_DATA_NAME = "model.onnx.data"
MANIFEST_NAME = "manifest.json"
Exporter = Literal["dynamo", "torchscript"]

# --------------------------------------------------------------------------- export


def _dynamic_axes(spec: IOSpec) -> dict[str, dict[int, str]]:
    axes = {}
    for tensor in (*spec.inputs, *spec.outputs):
        dynamic = {i: dim for i, dim in enumerate(tensor.shape) if isinstance(dim, str)}
        if dynamic:
            axes[tensor.name] = dynamic
    return axes


def _dynamic_shapes(spec: IOSpec) -> tuple:
    """torch.export dims per input, in positional order; the kv inputs (the wrapper's *past) form one tuple."""
    dims: dict[str, torch.export.Dim] = {}

    def for_tensor(tensor: TensorSpec) -> dict[int, torch.export.Dim]:
        return {i: dims.setdefault(dim, torch.export.Dim(dim, min=0))
                for i, dim in enumerate(tensor.shape) if isinstance(dim, str)}

    named = [for_tensor(tensor) for tensor in spec.inputs if not tensor.kv]
    return (*named, tuple(for_tensor(tensor) for tensor in spec.inputs if tensor.kv))


STACK_TRACE_KEY = "pkg.torch.onnx.stack_trace"


def _drop_stack_traces(model: onnx.ModelProto) -> None:
    """The dynamo exporter records each node's Python stack trace, absolute source paths included, so the
    same weights exported from two checkouts would be different files; serving never reads it."""
    nodes = [*model.graph.node, *(node for function in model.functions for node in function.node)]
    for node in nodes:
        kept = [prop for prop in node.metadata_props if prop.key != STACK_TRACE_KEY]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)


def export_onnx(wrapper: nn.Module, spec: IOSpec, example: dict, out_dir: Path,
                opset: int, exporter: Exporter = "dynamo") -> Path:
    """Export `wrapper` to `out_dir/model.onnx` (+ `model.onnx.data`), then run `onnx.checker`."""
    args = tuple(torch.as_tensor(example[name]) for name in spec.input_names)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".onnx.") as tmp:
        raw = Path(tmp) / "raw.onnx"
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # tracer / deprecation chatter, not actionable for users
            try:
                if exporter == "dynamo":
                    torch.onnx.export(wrapper, args, str(raw), input_names=spec.input_names,
                                      output_names=spec.output_names, opset_version=opset,
                                      dynamic_shapes=_dynamic_shapes(spec), dynamo=True,
                                      verbose=False)
                else:
                    torch.onnx.export(wrapper, args, str(raw), input_names=spec.input_names,
                                      output_names=spec.output_names, opset_version=opset,
                                      dynamic_axes=_dynamic_axes(spec), dynamo=False)
            except Exception as error:  # the exporters raise many types; the first line is the useful part
                disk = os_error_behind(error, out_dir)
                if disk is not None:  # the disk, not the exporter: the other exporter would fail alike
                    raise DraftlineError(describe_os_error(disk)) from None
                first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                other = "torchscript" if exporter == "dynamo" else "dynamo"
                raise DraftlineError(f"ONNX export ({exporter}) failed: {first}; "
                                     f"try export.exporter: {other} in params.yaml") from None
        model = onnx.load(str(raw))
        _drop_stack_traces(model)
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


# --------------------------------------------------------------------------- ONNX Runtime


def ort_session(path: Path, providers: Sequence[str] = ("CPUExecutionProvider",)) -> ort.InferenceSession:
    """The one way draftline opens an ONNX model (export parity checks and the ONNX decoding backends)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3  # ORT's graph-optimisation warnings are noise for a parity check
    return ort.InferenceSession(str(path), options, providers=list(providers))


def read_export(export_dir: Path, kind: str, providers: Sequence[str] = ("CPUExecutionProvider",),
                ) -> tuple[ort.InferenceSession, IOSpec]:
    """The verified export of `kind` under `export_dir`: an ONNX Runtime session and its I/O contract."""
    export_dir = Path(export_dir)
    hint = f"run `dvc repro export` (or `draftline export`) with '{kind}' in export.kinds"
    manifest_path, model_path = export_dir / MANIFEST_NAME, export_dir / ONNX_NAME
    if not manifest_path.is_file() or not model_path.is_file():
        raise DraftlineError(f"no exported {kind} drafter at {export_dir} (manifest.json/model.onnx missing); {hint}")
    verify_manifest(export_dir)
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    if manifest.get("kind") != kind:
        raise DraftlineError(f"{export_dir} holds a '{manifest.get('kind')}' export, not the {kind} drafter; {hint}")
    return ort_session(model_path, providers), IOSpec.from_json(manifest["onnx"])


# --------------------------------------------------------------------------- parity


def error_stats(reference: np.ndarray, candidate: np.ndarray, atol: float, rtol: float) -> dict:
    """max |a-b|, max |a-b|/|b| over elements where |b| > atol, and the np.allclose verdict."""
    reference, candidate = reference.astype(np.float64), candidate.astype(np.float64)
    # equal infinities (logits masked off a reduced draft vocabulary) agree exactly; any other infinity differs
    finite = np.isfinite(reference) & np.isfinite(candidate)
    with np.errstate(invalid="ignore"):
        raw = np.abs(candidate - reference)
    diff = np.where(candidate == reference, 0.0, np.where(finite, raw, np.inf))
    scale = np.where(finite, np.abs(reference), 0.0)
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


def run_wrapper(wrapper: nn.Module, spec: IOSpec, feeds: dict) -> list[np.ndarray]:
    """The PyTorch wrapper on named feeds (arrays or tensors), outputs as numpy in `spec.output_names` order."""
    with torch.no_grad():
        outputs = wrapper(*(torch.as_tensor(feeds[name]) for name in spec.input_names))
    outputs = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
    return [t.float().numpy() if t.is_floating_point() else t.numpy() for t in outputs]


def run_session(session: ort.InferenceSession, spec: IOSpec, feeds: dict) -> list[np.ndarray]:
    """ONNX Runtime on named feeds (arrays or CPU tensors), outputs in `spec.output_names` order."""
    return session.run(spec.output_names, {name: np.asarray(feeds[name]) for name in spec.input_names})


def named_outputs(spec: IOSpec, outputs: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs in `spec.output_names` order (as `run_wrapper` and `run_session` return them), by name."""
    return dict(zip(spec.output_names, outputs))
