"""Offline: the verifier's outputs rebuilt from a batch's stored features and the verifier's head.

HF semantics exactly: `hidden_states[i]` is the stored layer i (None for a layer not stored),
`hidden_states[N] = norm(layer N)` (stored before the final norm) and `logits = lm_head(norm(layer N))`,
so the kinds' loss code reads them as it reads the online verifier's forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from pipeline.training.feature_batches import batch_layers
from pipeline.training.verifier_head import VerifierHead

# Greedy decoding (decoded τ) needs the whole verifier: what the decoded keys hold offline, and why
OFFLINE_DECODED = {"decode_tau": None, "decode_tau_no_prefill": None, "decode_acceptance": None}
DECODED_OFFLINE_NOTE = "decoded tau needs the full verifier: offline training leaves it to stage evaluate"


@dataclass(frozen=True)
class FeatureOutputs:
    hidden_states: tuple[Tensor | None, ...]
    logits: Tensor


class FeatureVerifier:
    """A `VerifierSource` (pipeline/training/frozen.py) over batch features; it cannot decode (`model` is None)."""

    model = None

    def __init__(self, head: VerifierHead):
        self.head = head
        self.depth = int(head.config.get_text_config().num_hidden_layers)

    @property
    def config(self) -> Any:
        return self.head.config

    def to(self, device: torch.device) -> "FeatureVerifier":
        self.head.to(torch.device("cpu") if device.type == "cpu" else device)
        return self

    def _layers(self, batch: dict[str, Tensor]) -> dict[int, Tensor]:
        return {layer: states.to(self.head.dtype) for layer, states in batch_layers(batch).items()}

    @torch.no_grad()
    def outputs(self, batch: dict[str, Tensor]) -> FeatureOutputs:
        layers = self._layers(batch)
        layers[self.depth] = self.head.model.norm(layers[self.depth])
        hidden_states = tuple(layers.get(index) for index in range(self.depth + 1))
        return FeatureOutputs(hidden_states, self.head.lm_head(hidden_states[self.depth]))

    @torch.no_grad()
    def response_logits(self, batch: dict[str, Tensor]) -> Tensor:
        last = self._layers(batch)[self.depth][batch["loss_mask"]]
        return self.head.lm_head(self.head.model.norm(last)).unsqueeze(0)
