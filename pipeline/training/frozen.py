"""Where training gets the verifier's outputs: the frozen verifier run in the training process (online), or
its stored features plus its head (offline, pipeline/training/feature_verifier.py). Both answer with HF's
semantics (`outputs(batch).hidden_states` indexed like HF's tuple, `.logits`), so no loss code knows which.

The frozen verifier is held *beside* a LightningModule, not inside it: a teacher registered as a
submodule would be partitioned by DeepSpeed ZeRO-3 together with the student and gathered/partitioned on
every forward (it breaks or crawls; docs/algorithms.md#deepspeed-on-cpu). Holding it in a plain object
keeps it out of `parameters()`, the optimizer, ZeRO-3, checkpoints and DDP.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor, nn


def response_logits(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """(1, N, V) logits of an HF causal LM at the N response prediction positions (`loss_mask`) only.

    The vocabulary projection dominates a small drafter's cost, so prompt and padding positions
    skip it (about 2-3x less work on the demo corpus).
    """
    hidden = model.get_decoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    return model.get_output_embeddings()(hidden[batch["loss_mask"]]).unsqueeze(0)


class VerifierSource(Protocol):
    """What the kinds read of the verifier during training."""

    # the full verifier for greedy decoding (decoded τ), None offline: only `evaluate` can measure that then
    model: nn.Module | None
    # embeddings, final norm and LM head with HF's accessors: the full model online, `VerifierHead` offline
    head: nn.Module

    @property
    def config(self) -> Any: ...

    def to(self, device: torch.device) -> "VerifierSource": ...

    def outputs(self, batch: dict[str, Tensor]) -> Any:
        """`.hidden_states` (HF's tuple; None where offline features hold no layer) and `.logits` (B, T, V)."""

    def response_logits(self, batch: dict[str, Tensor]) -> Tensor:
        """(1, N, V) logits at the batch's `loss_mask` positions."""


class FrozenVerifier:
    """Online: the whole verifier, eval-mode and grad-free. Move it with `.to(device)` in `setup`."""

    def __init__(self, model: nn.Module):
        model.eval()
        model.requires_grad_(False)
        self.model = self.head = model

    def to(self, device: torch.device) -> "FrozenVerifier":
        # CPU "devices" may carry a rank index (CPUDeepSpeedStrategy); the tensors live on plain CPU.
        self.model.to(torch.device("cpu") if device.type == "cpu" else device)
        return self

    @property
    def config(self) -> Any:
        return self.model.config

    @torch.no_grad()
    def outputs(self, batch: dict[str, Tensor]) -> Any:
        return self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                          output_hidden_states=True)

    @torch.no_grad()
    def response_logits(self, batch: dict[str, Tensor]) -> Tensor:
        return response_logits(self.model, batch)
