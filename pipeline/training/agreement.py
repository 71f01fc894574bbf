"""The acceptance numbers every drafter reports during validation: per-position top-1 agreement with
the verifier, counted the way speculative decoding accepts drafts (position i only if all before it)."""

from __future__ import annotations

from typing import Sequence

import torch
from lightning.pytorch import LightningModule
from torch import Tensor


class AgreementCounts:
    """Per-draft-position hits/trials; rate_i = P(position i accepted | positions < i accepted)."""

    def __init__(self, positions: int):
        self.hits = torch.zeros(positions, dtype=torch.float64)
        self.trials = torch.zeros(positions, dtype=torch.float64)

    def add(self, hits: torch.Tensor, trials: torch.Tensor) -> None:
        self.hits += hits.detach().to("cpu", torch.float64)
        self.trials += trials.detach().to("cpu", torch.float64)

    def add_windows(self, match: torch.Tensor, valid: torch.Tensor) -> None:
        """Count every k-token draft window starting at a valid position of `match`/`valid` (B, T).

        `match[b, t]`: the drafter's top-1 at prediction position t equals the verifier's. A window
        starting at s accepts position i iff match[s..s+i] all hold (positions past `valid` are not tried).
        """
        positions = self.hits.numel()
        match = match & valid
        alive = valid.clone()
        for i in range(positions):
            shifted_match = _shift_left(match, i)
            tried = alive & _shift_left(valid, i)
            alive = tried & shifted_match
            self.trials[i] += tried.sum().item()
            self.hits[i] += alive.sum().item()

    def rates(self) -> list[float]:
        return [float(h / t) if t > 0 else 0.0 for h, t in zip(self.hits, self.trials)]

    def reduce(self, module: LightningModule) -> None:
        """Sum the counts over all processes (for distributed validation)."""
        if module.trainer is not None and module.trainer.world_size > 1:
            self.hits = module.all_gather(self.hits.to(module.device)).sum(0).cpu().reshape(-1)
            self.trials = module.all_gather(self.trials.to(module.device)).sum(0).cpu().reshape(-1)


def _shift_left(tensor: torch.Tensor, by: int) -> torch.Tensor:
    if by == 0:
        return tensor
    pad = torch.zeros_like(tensor[:, :by])
    return torch.cat([tensor[:, by:], pad], dim=1)


def simulated_acceptance_length(rates: Sequence[float]) -> float:
    """Σ_k Π_{i≤k} acc_i: expected accepted draft tokens per step (bonus token not included)."""
    total, survive = 0.0, 1.0
    for rate in rates:
        survive *= rate
        total += survive
    return total


class DraftAgreement:
    """Accumulates per-position matches of validation drafts (B, N, K) into the acceptance proxy."""

    def __init__(self, positions: int):
        self.tally = AgreementCounts(positions)
        self.matched = torch.zeros(positions, dtype=torch.float64)
        self.counted = torch.zeros(positions, dtype=torch.float64)

    def add(self, match: Tensor, label_valid: Tensor) -> None:
        match, valid = match.flatten(0, 1), label_valid.flatten(0, 1)
        accepted = match.long().cumprod(dim=1).bool()
        reached = torch.cat([torch.ones_like(accepted[:, :1]), accepted[:, :-1]], dim=1) & valid
        self.tally.add(accepted.sum(0), reached.sum(0))
        self.matched += match.sum(0).to("cpu", torch.float64)
        self.counted += valid.sum(0).to("cpu", torch.float64)

    def reduce(self, module: LightningModule) -> None:
        self.tally.reduce(module)
        if module.trainer is not None and module.trainer.world_size > 1:
            self.matched = module.all_gather(self.matched.to(module.device)).reshape(-1, self.matched.numel()).sum(0).cpu()
            self.counted = module.all_gather(self.counted.to(module.device)).reshape(-1, self.counted.numel()).sum(0).cpu()

    def summary(self) -> dict:
        rates = self.tally.rates()
        per_position = [float(m / c) if c > 0 else 0.0 for m, c in zip(self.matched, self.counted)]
        return {
            "top1_agreement": rates,
            "position_top1_agreement": per_position,
            "simulated_acceptance_length": simulated_acceptance_length(rates),
        }
