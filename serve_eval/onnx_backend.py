"""Drafter backends on ONNX Runtime, over the graphs of stage `export`.

`OnnxARDrafter` implements `serve_eval.drafters.ARDraftBackend` (flat KV cache fed back each call);
`OnnxBlockDrafter` has the interface `BlockProposer` uses on `serve_eval.drafters.BlockDrafter`
(one DFlash pass per block, context K/V cached as flat arrays). The I/O contract (names, KV heads,
head dim) is read from the export's `manifest.json`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from pipeline.errors import DraftlineError
from pipeline.integrity import verify_manifest

class OnnxARDrafter:
    """`ARDraftBackend` over an exported AR drafter; the cache is the list of `present_*` arrays."""

    name = "onnx"

    def __init__(self, session: ort.InferenceSession, input_names: list[str], output_names: list[str],
                 num_key_value_heads: int, head_dim: int):
        self.session = session
        self.input_names = input_names
        self.output_names = output_names
        self.empty = np.zeros((1, num_key_value_heads, 0, head_dim), dtype=np.float32)
        self.cache: list[np.ndarray] = []
        self.reset()

    @property
    def cache_length(self) -> int:
        return int(self.cache[0].shape[2])

    def reset(self) -> None:
        self.cache = [self.empty] * (len(self.input_names) - 2)

    def forward(self, token_ids: list[int]) -> torch.Tensor:
        start = self.cache_length
        feeds = {
            self.input_names[0]: np.asarray([token_ids], dtype=np.int64),
            self.input_names[1]: np.arange(start, start + len(token_ids), dtype=np.int64)[None],
        }
        feeds.update(zip(self.input_names[2:], self.cache))
        logits, *present = self.session.run(self.output_names, feeds)
        self.cache = present
        return torch.from_numpy(np.ascontiguousarray(logits[0, -1])).float()

    def crop(self, length: int) -> None:
        if length > self.cache_length:
            raise ValueError(f"cannot crop a cache of {self.cache_length} tokens to {length}")
        self.cache = [c[:, :, :length] for c in self.cache]


class OnnxBlockDrafter:
    """The DFlash drafter on ONNX Runtime, interchangeable with `BlockDrafter` in `BlockProposer`.

    `extend` fuses the verifier's hidden states with the drafter's `fc`/`hidden_norm` (PyTorch, one
    matmul) and holds them until the next `draft`, which appends them to the cached context K/V in
    the same ONNX call that drafts the block.
    """

    def __init__(self, session: ort.InferenceSession, input_names: list[str], output_names: list[str],
                 fuser: torch.nn.Module, num_key_value_heads: int, head_dim: int):
        self.session = session
        self.input_names = input_names
        self.output_names = output_names
        self.fuser = fuser
        self.block_size = int(fuser.config.block_size)
        self.empty = np.zeros((1, num_key_value_heads, 0, head_dim), dtype=np.float32)
        self.reset()

    def reset(self) -> None:
        self.positions = np.zeros((1, 0), dtype=np.int64)
        self.cache = [self.empty] * (len(self.input_names) - 5)
        self.pending: list[np.ndarray] = []
        self.context_length = 0

    @torch.inference_mode()
    def extend(self, hidden_states: tuple[torch.Tensor, ...], first_position: int, count: int) -> None:
        if count == 0:
            return
        assert first_position == self.context_length, "context features must stay contiguous"
        features = self.fuser.fuse_target_hidden(tuple(h[:, :count] for h in hidden_states))
        self.pending.append(features.float().cpu().numpy())
        self.context_length += count

    def draft(self, anchor_id: int, anchor_position: int) -> list[int]:
        if not self.pending:
            raise ValueError("the ONNX block drafter needs new context features before each draft")
        features = np.concatenate(self.pending, axis=1)
        start = int(self.positions.shape[1])
        feeds = dict(zip(self.input_names[:5], (
            np.asarray([anchor_id], dtype=np.int64),
            np.asarray([anchor_position], dtype=np.int64),
            features,
            np.arange(start, start + features.shape[1], dtype=np.int64)[None],
            self.positions,
        )))
        feeds.update(zip(self.input_names[5:], self.cache))
        logits, self.positions, *self.cache = self.session.run(self.output_names, feeds)
        self.pending = []
        return logits[0].argmax(-1).tolist()


def _read_export(export_dir: Path, kind: str, providers: tuple[str, ...]) -> tuple[ort.InferenceSession, dict]:
    export_dir = Path(export_dir)
    hint = f"run `dvc repro export` (or `draftline export`) with '{kind}' in export.kinds"
    manifest_path, model_path = export_dir / "manifest.json", export_dir / "model.onnx"
    if not manifest_path.is_file() or not model_path.is_file():
        raise DraftlineError(f"no exported {kind} drafter at {export_dir} (manifest.json/model.onnx missing); {hint}")
    verify_manifest(export_dir)
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    if manifest.get("kind") != kind:
        raise DraftlineError(f"{export_dir} holds a '{manifest.get('kind')}' export, not the {kind} drafter; {hint}")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(model_path), options, providers=list(providers)), manifest["onnx"]


def load_onnx_ar_drafter(export_dir: Path, providers: tuple[str, ...] = ("CPUExecutionProvider",)) -> OnnxARDrafter:
    session, onnx_info = _read_export(export_dir, "ar", providers)
    return OnnxARDrafter(
        session,
        [t["name"] for t in onnx_info["inputs"]],
        [t["name"] for t in onnx_info["outputs"]],
        int(onnx_info["sizes"]["num_key_value_heads"]),
        int(onnx_info["sizes"]["head_dim"]),
    )


def load_onnx_block_drafter(export_dir: Path, denoise_steps: int = 1,
                            providers: tuple[str, ...] = ("CPUExecutionProvider",)) -> OnnxBlockDrafter:
    if denoise_steps != 1:
        raise DraftlineError(f"the ONNX block drafter runs one DFlash pass per block; set evaluate.denoise_steps: 1 "
                             f"(got {denoise_steps}) or evaluate.backend: torch")
    session, onnx_info = _read_export(export_dir, "block", providers)
    from serve_eval.drafters import load_block_model  # the fusing projection lives in the checkpoint

    return OnnxBlockDrafter(
        session,
        [t["name"] for t in onnx_info["inputs"]],
        [t["name"] for t in onnx_info["outputs"]],
        load_block_model(Path(export_dir) / "serving"),
        int(onnx_info["sizes"]["num_key_value_heads"]),
        int(onnx_info["sizes"]["head_dim"]),
    )
