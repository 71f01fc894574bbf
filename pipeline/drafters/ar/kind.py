"""The AR drafter kind: a small causal LM that drafts k tokens one by one with its own KV cache."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedModel

from pipeline.config.evaluate_config import EvaluateConfig
from pipeline.config.export_config import ProfileConfig
from pipeline.drafters.ar import onnx, serving
from pipeline.drafters.ar.decoding import ARProposer, TorchARDrafter
from pipeline.drafters.ar.model import load_drafter
from pipeline.drafters.ar.onnx import load_onnx_drafter
from pipeline.drafters.interface import DrafterKind, Launch, LoadedDrafter, OnnxExport, OnnxJob
from pipeline.drafters.onnx_io import IOSpec


class ARKind:
    name = "ar"

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
        model = load_drafter(drafter_dir, verifier.dtype).to(verifier.device)
        backend = load_onnx_drafter(export_dir) if config.backend == "onnx" else TorchARDrafter(model)
        return LoadedDrafter(ARProposer(backend, serving.draft_tokens(drafter_dir)), backend.name, model)


KIND: DrafterKind = ARKind()
