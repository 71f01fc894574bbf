"""The EAGLE-3 kind: a one-layer head that drafts k tokens one by one from the verifier's low / middle /
high hidden states, continuing each step from its own previous state."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedModel

from pipeline.config.evaluate_config import EvaluateConfig
from pipeline.config.export_config import ProfileConfig
from pipeline.drafters.eagle3 import onnx, serving
from pipeline.drafters.eagle3.decoding import Eagle3Proposer, TorchEagle3Head
from pipeline.drafters.eagle3.model import load_drafter
from pipeline.drafters.eagle3.onnx import load_onnx_head
from pipeline.drafters.interface import DrafterKind, Launch, LoadedDrafter, OnnxExport, OnnxJob
from pipeline.drafters.onnx_io import IOSpec
from pipeline.drafters.served_checks import trained_draft_tokens


class Eagle3Kind:
    name = "eagle3"

    def serving_layout(self, serving_dir: Path) -> dict:
        return serving.serving_layout(serving_dir)

    def launch(self, served: dict, verifier: str, draft: Path, drafter_dir: Path) -> Launch:
        return serving.launch(served, verifier, draft, drafter_dir)

    def export_onnx(self, job: OnnxJob) -> OnnxExport:
        return onnx.export(job)

    def opt_feeds(self, spec: IOSpec, profile: ProfileConfig, seed: int) -> dict[str, torch.Tensor]:
        return onnx.opt_feeds(spec, profile, seed)

    def load(self, drafter_dir: Path, verifier: PreTrainedModel, config: EvaluateConfig,
             export_dir: Path) -> LoadedDrafter:
        if config.backend == "onnx":
            head = load_onnx_head(export_dir)
        else:
            head = TorchEagle3Head(load_drafter(drafter_dir, verifier.dtype).to(verifier.device), verifier)
        return LoadedDrafter(Eagle3Proposer(head, trained_draft_tokens(drafter_dir, "eagle3")), head.name, None)


KIND: DrafterKind = Eagle3Kind()
