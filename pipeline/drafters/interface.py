"""What a drafter kind is (`pipeline/drafters/<kind>/kind.py` builds one), and what the stages
exchange with it. Stages iterate over kinds through `pipeline.drafters.kinds`; nothing
outside a kind's package branches on its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import numpy as np
import onnxruntime as ort
import torch
from torch import nn
from transformers import PreTrainedModel

from pipeline.config.evaluate_config import EvaluateConfig
from pipeline.config.export_config import ExportConfig, ProfileConfig
from pipeline.drafters.onnx_io import ParityReport, export_onnx, ort_session
from pipeline.drafters.onnx_parity import opt_feeds
from pipeline.drafters.onnx_spec import IOSpec
from pipeline.drafters.proposer import Proposer


@dataclass(frozen=True)
class Launch:
    markdown: str  # launch.md: vLLM / SGLang / TensorRT-LLM commands with the real paths
    speculative_config: dict  # vLLM's --speculative-config, which serve_check runs verbatim
    # llama-server's --spec-type for this drafter (draft-simple, draft-eagle3, draft-dflash, draft-dspark); its
    # draft length is speculative_config's num_speculative_tokens (export/launch_files.py writes the command)
    llama_spec_type: str


@dataclass(frozen=True)
class OnnxJob:
    """What a kind needs to export its ONNX graph and check it against PyTorch."""

    kind: str  # the kind's name (one module may export several kinds: the block family)
    drafter_dir: Path  # the trained checkpoint
    serving_dir: Path  # the served copy (the AR drafter exports from it, as serving stacks load it)
    out: Path  # the export directory being written
    config: ExportConfig
    seed: int
    texts: list[tuple[list[int], list[int]]]  # (prompt ids, response ids) of corpus test rows
    verifier: PreTrainedModel

    def verifier_texts(self, fuse: Callable[[tuple[torch.Tensor, ...]], torch.Tensor],
                       ) -> list[tuple[torch.Tensor, list[int]]]:
        """Each parity text as (the verifier's hidden states over it, fused by `fuse`; its token ids)."""
        texts = []
        with torch.no_grad():
            for prompt, response in self.texts:
                ids = prompt + response
                hidden = self.verifier(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
                texts.append((fuse(hidden), ids))
        return texts


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


class KindOnnx(Protocol):
    """A kind's `onnx.py`: the module it exports, its parity check and the random inputs both feed."""

    def graph(self, job: OnnxJob) -> tuple[nn.Module, IOSpec]:
        """The module to export (the trained drafter in flat named tensors) and its I/O contract."""

    def parity(self, job: OnnxJob, wrapper: nn.Module, session: ort.InferenceSession, spec: IOSpec) -> ParityReport:
        """The exported graph on ONNX Runtime against PyTorch."""

    def random_feeds(self, spec: IOSpec, batch: int, new: int, cached: int,
                     generator: torch.Generator) -> dict[str, np.ndarray]:
        """Named random inputs for `new` positions after `cached` ones."""


class KindServing(Protocol):
    """A kind's `serving.py`: the served layout and how serving stacks launch it."""

    def serving_layout(self, serving_dir: Path) -> dict:
        """Turn the copied checkpoint into what serving stacks load, check it; returns the served config."""

    def launch(self, served: dict, verifier: str, draft: Path, drafter_dir: Path) -> Launch:
        """launch.md and vLLM's speculative config for the served draft dir (verifier as serving stacks name it)."""


Loader = Callable[[Path, PreTrainedModel, EvaluateConfig, Path], LoadedDrafter]


@dataclass(frozen=True)
class DrafterKind:
    """One drafter kind: what the export and evaluation stages call. A kind's `kind.py` builds it from its
    own modules (its `onnx.py`, `serving.py` and a loader) as `KIND`; a new kind is its package and its entry
    in pipeline/drafters/registry.py."""

    name: str  # its package's name (the registry's): artifacts/drafters/<name>, stage train_<name>, params train.<name>
    onnx: KindOnnx
    serving: KindServing
    load: Loader  # (drafter_dir, verifier, evaluate config, export_dir): the drafter on `config.backend`

    def serving_layout(self, serving_dir: Path) -> dict:
        return self.serving.serving_layout(serving_dir)

    def launch(self, served: dict, verifier: str, draft: Path, drafter_dir: Path) -> Launch:
        return self.serving.launch(served, verifier, draft, drafter_dir)

    def export_onnx(self, job: OnnxJob) -> OnnxExport:
        """The kind's graph to ONNX (traced on random inputs), checked against PyTorch."""
        wrapper, spec = self.onnx.graph(job)
        example = self.onnx.random_feeds(spec, 2, 3, 5, torch.Generator().manual_seed(job.seed))
        path = export_onnx(wrapper, spec, example, job.out, job.config.opset, job.config.exporter)
        return OnnxExport(wrapper, spec, path, self.onnx.parity(job, wrapper, ort_session(path), spec))

    def opt_feeds(self, spec: IOSpec, profile: ProfileConfig, seed: int) -> dict[str, torch.Tensor]:
        """Random inputs at the TensorRT profile's opt shapes."""
        return opt_feeds(self.onnx.random_feeds, spec, profile, seed)
