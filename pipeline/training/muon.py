"""Muon for a drafter's hidden weight matrices and AdamW for the rest, as one torch optimizer.

`torch.optim.Muon` orthogonalises 2-D updates only, so norms, biases and vectors need a second optimizer,
and so do embedding-like matrices (token embeddings, vocabulary heads), which Muon practice leaves to AdamW.
Lightning steps several optimizers only under manual optimization; one optimizer whose param_groups are the
two inner optimizers' own group dicts keeps automatic optimization, gradient clipping, accumulation, the
per-step schedule (it rescales every group's lr in place) and checkpointing working unchanged.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

# 2-D weights that are vocabulary-sized lookups or outputs (the DSpark Markov head's V x r / r x V, an LM
# head, token embeddings) or a scalar readout (the confidence head): AdamW, as Muon's authors prescribe
ADAMW_NAME_HINTS = ("embed", "head")


def is_hidden_matrix(name: str, parameter: nn.Parameter) -> bool:
    """Whether Muon optimizes `parameter`: a true matrix (both sides > 1) outside embeddings and heads."""
    return parameter.ndim == 2 and min(parameter.shape) > 1 and not any(hint in name for hint in ADAMW_NAME_HINTS)


def split_for_muon(named: Iterable[tuple[str, nn.Parameter]]) -> tuple[list, list, list]:
    """Trainable (name, parameter) pairs as (Muon matrices, AdamW with decay: other matrices, AdamW without:
    vectors)."""
    matrices, decay, no_decay = [], [], []
    for name, parameter in named:
        if is_hidden_matrix(name, parameter):
            matrices.append(parameter)
        else:
            (decay if parameter.ndim >= 2 else no_decay).append(parameter)
    return matrices, decay, no_decay


class MuonAdamW(torch.optim.Optimizer):
    """`torch.optim.Muon` over `matrices` and `torch.optim.AdamW` over the rest, stepped together.

    Muon's lr is adjusted to match AdamW's update RMS (`adjust_lr_fn="match_rms_adamw"`), so one learning
    rate and one schedule mean the same step size for both.
    """

    def __init__(self, matrices: list, decay: list, no_decay: list, lr: float, weight_decay: float,
                 betas: tuple[float, float] = (0.9, 0.95)):
        if not matrices:
            raise ValueError("Muon needs at least one hidden weight matrix to optimize")
        self._muon = torch.optim.Muon(matrices, lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw")
        adamw_groups = [{"params": group, "weight_decay": wd}
                        for group, wd in ((decay, weight_decay), (no_decay, 0.0)) if group]
        self._adamw = torch.optim.AdamW(adamw_groups, lr=lr, betas=betas) if adamw_groups else None
        inner = self._muon.param_groups + (self._adamw.param_groups if self._adamw else [])
        super().__init__(inner, {})  # adopts the inner optimizers' group dicts themselves, not copies
        self._link()

    def _link(self) -> None:
        """Point the inner optimizers at this one's groups and state (their parameters are disjoint)."""
        split = len(self._muon.param_groups)
        self._muon.param_groups, self._muon.state = self.param_groups[:split], self.state
        if self._adamw is not None:
            self._adamw.param_groups, self._adamw.state = self.param_groups[split:], self.state

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)  # rebuilds param_groups and state: re-share them
        self._link()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._muon.step()
        if self._adamw is not None:
            self._adamw.step()
        return loss
