"""The AR drafter kind: a small causal LM that drafts k tokens one by one with its own KV cache."""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedModel

from pipeline.config.evaluate_config import EvaluateConfig
from pipeline.drafters.ar import onnx, serving
from pipeline.drafters.ar.decoding import ARProposer, TorchARDrafter
from pipeline.drafters.ar.model import load_drafter
from pipeline.drafters.ar.spec import AR as SPEC
from pipeline.drafters.interface import DrafterKind, LoadedDrafter


def load(drafter_dir: Path, verifier: PreTrainedModel, config: EvaluateConfig, export_dir: Path) -> LoadedDrafter:
    """The torch model always loads: HF assisted generation uses it as the peer model on either backend."""
    model = load_drafter(drafter_dir, verifier.dtype).to(verifier.device)
    backend = onnx.load_onnx_drafter(export_dir) if config.backend == "onnx" else TorchARDrafter(model)
    return LoadedDrafter(ARProposer(backend, serving.draft_tokens(drafter_dir)), backend.name, model)


KIND = DrafterKind(name=SPEC.name, onnx=onnx, serving=serving, load=load)
