"""The block drafter kind: a DFlash-style drafter that drafts a whole block per pass from the
verifier's own hidden states."""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedModel

from pipeline.config import EvaluateConfig
from pipeline.drafters.block import onnx, serving
from pipeline.drafters.block.decoding import BlockDrafter, BlockProposer, load_onnx_drafter
from pipeline.drafters.block.model import load_drafter
from pipeline.drafters.kind import DrafterKind, LoadedDrafter


def load(drafter_dir: Path, verifier: PreTrainedModel, config: EvaluateConfig, export_dir: Path) -> LoadedDrafter:
    if config.backend == "onnx":
        drafter = load_onnx_drafter(export_dir, config.denoise_steps)
    else:
        model = load_drafter(drafter_dir, verifier.dtype).to(verifier.device)
        drafter = BlockDrafter(model, verifier, config.denoise_steps)
    return LoadedDrafter(BlockProposer(drafter), config.backend, None)


BLOCK = DrafterKind(name="block", train_stage="train.block_stage", serving_layout=serving.serving_layout,
                    launch=serving.launch, export_onnx=onnx.export, opt_feeds=onnx.opt_feeds, load=load)
