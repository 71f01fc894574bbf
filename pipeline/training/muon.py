"""Muon for a drafter's hidden weight matrices and AdamW for the rest, as one torch optimizer.

`torch.optim.Muon` orthogonalises 2-D updates only, so norms, biases and vectors need a second optimizer,
and so do embedding-like matrices (token embeddings, vocabulary heads), which Muon practice leaves to AdamW.
Lightning steps several optimizers only under manual optimization; one optimizer whose param_groups are the
two inner optimizers' own group dicts keeps automatic optimization, gradient clipping, accumulation, the
per-step schedule (it rescales every group's lr in place) and checkpointing working unchanged.

torch's Muon runs its Newton-Schulz iteration in bfloat16: fast where bf16 matmul is native (GPUs, AVX512-BF16,
AMX), emulated and far slower elsewhere (an AVX2-only CPU spent ~45% of a block-drafter step there).
`PrecisionMuon` runs the same iteration in a chosen dtype; `newton_schulz_dtype` picks bf16 only where a
measured probe finds it faster (pipeline/machine.py).
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn
from torch.optim._muon import _adjust_lr

from pipeline.config.trainer_config import MuonPrecision
from pipeline.machine import probe_matmul

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


def newton_schulz(update: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype) -> torch.Tensor:
    """torch's `_zeropower_via_newtonschulz` (the quintic iteration towards the orthogonal factor of `update`),
    in `dtype` instead of always bfloat16."""
    a, b, c = coefficients
    ortho = update.to(dtype, copy=True)  # normalized in place below: never the momentum buffer itself
    tall = ortho.size(0) > ortho.size(1)
    if tall:
        ortho = ortho.T
    ortho.div_(ortho.norm().clamp(min=eps))  # spectral norm at most 1
    for _ in range(steps):
        gram = ortho @ ortho.T
        ortho = torch.addmm(ortho, torch.addmm(gram, gram, gram, beta=b, alpha=c), ortho, beta=a)
    return ortho.T if tall else ortho


def newton_schulz_dtype(precision: MuonPrecision, matrices: list[nn.Parameter]) -> torch.dtype:
    """bfloat16 or float32 as asked; `auto`: bfloat16 where the probe times a Gram matmul of the largest
    matrix's size faster in it than in float32 on these matrices' device."""
    if precision != "auto":
        return getattr(torch, precision)
    largest = max(matrices, key=lambda matrix: matrix.numel())
    rows, cols = sorted(largest.shape)
    return torch.bfloat16 if probe_matmul(rows, cols, largest.device).bf16_fast else torch.float32


class PrecisionMuon(torch.optim.Muon):
    """`torch.optim.Muon` with its Newton-Schulz iteration in `dtype` (torch 2.13's Muon takes no hook for it).

    Its step is torch's `_single_tensor_muon`; in bfloat16 it matches torch's Muon exactly
    (tests/pipeline/training/test_muon.py).
    """

    def __init__(self, params: list, dtype: torch.dtype, **kwargs):
        super().__init__(params, **kwargs)
        self.dtype = dtype

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, momentum_buffers = [], [], []
            self._init_group(group, params, grads, momentum_buffers)
            momentum, lr = group["momentum"], group["lr"]
            for param, grad, buffer in zip(params, grads, momentum_buffers):
                buffer.lerp_(grad, 1 - momentum)
                update = grad.lerp(buffer, momentum) if group["nesterov"] else buffer
                update = newton_schulz(update, group["ns_coefficients"], group["ns_steps"], group["eps"], self.dtype)
                param.mul_(1 - lr * group["weight_decay"])
                param.add_(update, alpha=-_adjust_lr(lr, group["adjust_lr_fn"], param.shape))
        return loss


class MuonAdamW(torch.optim.Optimizer):
    """`torch.optim.Muon` over `matrices` and `torch.optim.AdamW` over the rest, stepped together.

    Muon's lr is adjusted to match AdamW's update RMS (`adjust_lr_fn="match_rms_adamw"`), so one learning
    rate and one schedule mean the same step size for both. `precision`: Newton-Schulz's dtype, or `auto`
    (`newton_schulz_dtype`); `self.precision` is the dtype it runs in, which training records.
    """

    def __init__(self, matrices: list, decay: list, no_decay: list, lr: float, weight_decay: float,
                 betas: tuple[float, float] = (0.9, 0.95), precision: MuonPrecision = "auto"):
        if not matrices:
            raise ValueError("Muon needs at least one hidden weight matrix to optimize")
        self.precision = newton_schulz_dtype(precision, matrices)
        self._muon = PrecisionMuon(matrices, self.precision, lr=lr, weight_decay=weight_decay,
                                   adjust_lr_fn="match_rms_adamw")
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
