"""The block drafter kind: a DFlash-style drafter that drafts a whole block per pass from the
verifier's own hidden states, exported for vLLM `method: dflash`.

The DSpark kind (pipeline/drafters/dspark/) is the same pass plus a Markov head (and a confidence head);
`family_kind` builds either: the checkpoint's config (`markov_rank`) says which heads run and which
layout is served (pipeline/drafters/block/serving.py).
"""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedModel

from pipeline.config.evaluate_config import EvaluateConfig
from pipeline.drafters.block import onnx, serving
from pipeline.drafters.block.decoding import BlockDrafter, BlockProposer
from pipeline.drafters.block.model import load_drafter
from pipeline.drafters.block.spec import BLOCK as SPEC
from pipeline.drafters.interface import DrafterKind, LoadedDrafter


def family_kind(name: str) -> DrafterKind:
    """A block-family kind named `name` (its drafter dir, export dir and ONNX manifest carry that name)."""

    def load(drafter_dir: Path, verifier: PreTrainedModel, config: EvaluateConfig, export_dir: Path) -> LoadedDrafter:
        if config.backend == "onnx":
            drafter = onnx.load_onnx_drafter(export_dir, name, config.denoise_steps)
        else:
            model = load_drafter(drafter_dir, name, verifier.dtype).to(verifier.device)
            drafter = BlockDrafter(model, verifier, config.denoise_steps)
        return LoadedDrafter(BlockProposer(drafter, config.confidence_threshold), config.backend, None)

    return DrafterKind(name=name, onnx=onnx, serving=serving, load=load)


KIND = family_kind(SPEC.name)
