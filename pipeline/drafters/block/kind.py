"""The block drafter kind: a DFlash-style drafter that drafts a whole block per pass from the
verifier's own hidden states.

One kind, two served layouts: with `train.block.markov_rank` 0 it is DFlash (vLLM `method: dflash`);
with markov_rank > 0 it is the DSpark variant, the same parallel pass plus a Markov head (and optionally
a confidence head), exported as vLLM's `Qwen3DSparkModel` (`method: dspark`). Same package, same
training stage; the checkpoint's config says which (`markov_rank`), and every part below follows it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedModel

from pipeline.config.evaluate_config import EvaluateConfig
from pipeline.config.export_config import ProfileConfig
from pipeline.drafters.block import onnx, serving
from pipeline.drafters.block.decoding import BlockDrafter, BlockProposer
from pipeline.drafters.block.model import load_drafter
from pipeline.drafters.block.onnx import load_onnx_drafter
from pipeline.drafters.interface import DrafterKind, Launch, LoadedDrafter, OnnxExport, OnnxJob
from pipeline.drafters.onnx_io import IOSpec


class BlockKind:
    name = "block"

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
            drafter = load_onnx_drafter(export_dir, config.denoise_steps)
        else:
            model = load_drafter(drafter_dir, verifier.dtype).to(verifier.device)
            drafter = BlockDrafter(model, verifier, config.denoise_steps)
        return LoadedDrafter(BlockProposer(drafter, config.confidence_threshold), config.backend, None)


KIND: DrafterKind = BlockKind()
