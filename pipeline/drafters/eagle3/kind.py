"""The EAGLE-3 kind: a one-layer head that drafts k tokens one by one from the verifier's low / middle /
high hidden states, continuing each step from its own previous state."""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedModel

from pipeline.config.evaluate_config import EvaluateConfig
from pipeline.drafters.eagle3 import onnx, serving
from pipeline.drafters.eagle3.decoding import Eagle3Proposer, TorchEagle3Head
from pipeline.drafters.eagle3.model import load_drafter
from pipeline.drafters.eagle3.spec import EAGLE3 as SPEC
from pipeline.drafters.interface import DrafterKind, LoadedDrafter
from pipeline.drafters.served_checks import trained_draft_tokens


def load(drafter_dir: Path, verifier: PreTrainedModel, config: EvaluateConfig, export_dir: Path) -> LoadedDrafter:
    if config.backend == "onnx":
        head = onnx.load_onnx_drafter(export_dir)
    else:
        head = TorchEagle3Head(load_drafter(drafter_dir, verifier.dtype).to(verifier.device), verifier)
    return LoadedDrafter(Eagle3Proposer(head, trained_draft_tokens(drafter_dir, "eagle3")), head.name, None)


KIND = DrafterKind(name=SPEC.name, onnx=onnx, serving=serving, load=load)
