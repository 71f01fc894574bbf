"""Per-cell sums of an evaluation (drafter x temperature x domain) and the metrics derived from them."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from pipeline.drafters.speculative_loop import Generation


@dataclass
class CellSums:
    """Sums over the prompts of one drafter x temperature x domain cell."""

    prompts: int = 0
    passes: int = 0  # passes over the prompts whose drafts the acceptance sums count
    drafted: int = 0
    accepted: int = 0
    committed: int = 0
    forwards: int = 0
    # wall seconds and tokens summed over the prompts, one entry per repeat of the whole cell
    spec_rounds: list[float] = field(default_factory=list)
    base_rounds: list[float] = field(default_factory=list)
    spec_round_tokens: list[int] = field(default_factory=list)
    base_round_tokens: list[int] = field(default_factory=list)
    draft_s: float = 0.0
    verify_s: float = 0.0
    mismatches: int = 0
    peer_s: float = 0.0
    peer_tokens: int = 0
    position_drafted: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    committed_per_step: dict[int, int] = field(default_factory=dict)

    def add(self, spec: Generation, repeat: int) -> None:
        """Acceptance of one speculative run of a prompt in pass `repeat` (0-based)."""
        self.prompts += repeat == 0
        self.passes = max(self.passes, repeat + 1)
        self.drafted += spec.drafted
        self.accepted += spec.accepted
        self.committed += len(spec.new_ids)
        self.forwards += spec.verifier_forwards
        for step in spec.steps:
            self.draft_s += step.draft_s
            self.verify_s += step.verify_s
            self.committed_per_step[step.committed] = self.committed_per_step.get(step.committed, 0) + 1
            for position in range(step.drafted):
                if position == len(self.position_drafted):
                    self.position_drafted.append(0)
                    self.position_accepted.append(0)
                self.position_drafted[position] += 1
                self.position_accepted[position] += position < step.accepted

    def add_time(self, repeat: int, spec: Generation, base: Generation) -> None:
        """The wall time and tokens of one prompt's speculative and verifier-alone runs in pass `repeat`."""
        if repeat == len(self.spec_rounds):
            self.spec_rounds.append(0.0)
            self.base_rounds.append(0.0)
            self.spec_round_tokens.append(0)
            self.base_round_tokens.append(0)
        self.spec_rounds[repeat] += spec.wall_s
        self.base_rounds[repeat] += base.wall_s
        self.spec_round_tokens[repeat] += len(spec.new_ids)
        self.base_round_tokens[repeat] += len(base.new_ids)

    @property
    def spec_s(self) -> float:
        return statistics.median(self.spec_rounds) if self.spec_rounds else 0.0

    @property
    def base_s(self) -> float:
        return statistics.median(self.base_rounds) if self.base_rounds else 0.0

    @staticmethod
    def _rates(tokens: list[int], seconds: list[float]) -> list[float]:
        return [count / max(wall, 1e-9) for count, wall in zip(tokens, seconds)]

    def speedups(self) -> list[float]:
        """Per repeat: speculative tokens/s over verifier-alone tokens/s (a sampled pass draws its own tokens)."""
        return [spec / max(base, 1e-9) for spec, base in zip(self._rates(self.spec_round_tokens, self.spec_rounds),
                                                              self._rates(self.base_round_tokens, self.base_rounds))]

    def metrics(self) -> dict:
        speedups = self.speedups() or [0.0]
        speedup = statistics.median(speedups)
        out = {
            "acceptance_rate": self.accepted / max(1, self.drafted),
            "tau": self.committed / max(1, self.forwards),
            "speedup": speedup,  # the median repeat: one slow or lucky repeat does not decide the gate
            "speedup_runs": speedups,
            "speedup_spread": (max(speedups) - min(speedups)) / max(speedup, 1e-9),
            "tokens_per_s": statistics.median(self._rates(self.spec_round_tokens, self.spec_rounds) or [0.0]),
            "baseline_tokens_per_s": statistics.median(self._rates(self.base_round_tokens, self.base_rounds) or [0.0]),
            "draft_time_s": self.draft_s,
            "verify_time_s": self.verify_s,
            "per_position_acceptance": [a / d for a, d in zip(self.position_accepted, self.position_drafted)],
            "prompts": self.prompts,
            "passes": self.passes,
        }
        if self.peer_tokens:
            peer_tokens_per_s = self.peer_tokens / max(self.peer_s, 1e-9)
            out["hf_assisted_tokens_per_s"] = peer_tokens_per_s
            out["ours_vs_hf_assisted"] = out["tokens_per_s"] / peer_tokens_per_s
        return out
