"""The interface every drafter kind implements (`pipeline/drafters/<kind>/kind.py`), and what the
stages exchange with it. Stages iterate over kinds through `pipeline.drafters.kinds`; nothing
outside a kind's package branches on its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import nn
from transformers import PreTrainedModel

from pipeline.config.evaluate_config import EvaluateConfig
from pipeline.config.export_config import ExportConfig, ProfileConfig
from pipeline.drafters.onnx_io import IOSpec, ParityReport
from pipeline.drafters.proposer import Proposer


@dataclass(frozen=True)
class Launch:
    markdown: str  # launch.md: vLLM / SGLang / TensorRT-LLM commands with the real paths
    speculative_config: dict  # vLLM's --speculative-config, which serve_check runs verbatim


@dataclass(frozen=True)
class OnnxJob:
    """What a kind needs to export its ONNX graph and check it against PyTorch."""

    drafter_dir: Path  # the trained checkpoint
    serving_dir: Path  # the served copy (the AR drafter exports from it, as serving stacks load it)
    out: Path  # the export directory being written
    config: ExportConfig
    seed: int
    texts: list[tuple[list[int], list[int]]]  # (prompt ids, response ids) of corpus test rows
    verifier: PreTrainedModel


@dataclass(frozen=True)
class OnnxExport:
    wrapper: nn.Module  # the exported module (TensorRT re-exports it at reduced precision)
    spec: IOSpec
    path: Path
    parity: ParityReport


@dataclass(frozen=True)
class LoadedDrafter:
    proposer: Proposer
    backend: str  # "torch" | "onnx"
    peer_model: PreTrainedModel | None  # a torch causal LM for HF assisted generation, when the kind has one


class DrafterKind(Protocol):
    """One drafter kind: what each stage calls (`pipeline/drafters/<kind>/kind.py` implements it as `KIND`).
    A new kind is its package and its entry in pipeline/drafters/registry.py."""

    name: str  # its package's name: artifacts/drafters/<name>, stage train_<name>, params train.<name>

    def serving_layout(self, serving_dir: Path) -> dict:
        """Turn the copied checkpoint into what serving stacks load, check it; returns the served config."""

    def launch(self, served: dict, verifier: str, draft: Path, drafter_dir: Path) -> Launch:
        """launch.md and vLLM's speculative config for the served draft dir (verifier as serving stacks name it)."""

    def export_onnx(self, job: OnnxJob) -> OnnxExport:
        """The ONNX graph of the trained drafter, with its parity against PyTorch."""

    def opt_feeds(self, spec: IOSpec, profile: ProfileConfig, seed: int) -> dict[str, torch.Tensor]:
        """Random inputs at the TensorRT profile's opt shapes."""

    def load(self, drafter_dir: Path, verifier: PreTrainedModel, config: EvaluateConfig,
             export_dir: Path) -> LoadedDrafter:
        """The drafter on `config.backend`, ready for the decoding loop."""
