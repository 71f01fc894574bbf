"""The block drafter kind: a DFlash-style drafter that drafts a whole block per pass from the
verifier's own hidden states.

One kind, two served layouts: with `train.block.markov_rank` 0 it is DFlash (vLLM `method: dflash`);
with markov_rank > 0 it is the DSpark variant, the same parallel pass plus a Markov head (and optionally
a confidence head), exported as vLLM's `Qwen3DSparkModel` (`method: dspark`). Same package, same
training stage; the checkpoint's config says which (`markov_rank`), and every part below follows it.
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


def load(drafter_dir: Path, verifier: PreTrainedModel, config: EvaluateConfig, export_dir: Path) -> LoadedDrafter:
    if config.backend == "onnx":
        drafter = onnx.load_onnx_drafter(export_dir, config.denoise_steps)
    else:
        drafter = BlockDrafter(load_drafter(drafter_dir, verifier.dtype).to(verifier.device), verifier, config.denoise_steps)
    return LoadedDrafter(BlockProposer(drafter, config.confidence_threshold), config.backend, None)


KIND = DrafterKind(name=SPEC.name, onnx=onnx, serving=serving, load=load)
