"""The frozen verifier (teacher) held *beside* a LightningModule, not inside it.

A teacher registered as a submodule would be partitioned by DeepSpeed ZeRO-3 together with the
student and gathered/partitioned on every forward (it breaks or crawls; docs/algorithms.md#deepspeed-on-cpu). Holding it
in a plain object keeps it out of `parameters()`, the optimizer, ZeRO-3, checkpoints and DDP.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class FrozenVerifier:
    """Eval-mode, grad-free wrapper; call it like the model. Move it with `.to(device)` in `setup`."""

    def __init__(self, model: nn.Module):
        model.eval()
        model.requires_grad_(False)
        self.model = model

    def to(self, device: torch.device) -> "FrozenVerifier":
        # CPU "devices" may carry a rank index (CPUDeepSpeedStrategy); the tensors live on plain CPU.
        self.model.to(torch.device("cpu") if device.type == "cpu" else device)
        return self

    @property
    def config(self) -> Any:
        return self.model.config

    @torch.no_grad()
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)
