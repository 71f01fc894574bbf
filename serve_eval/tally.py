"""Per-cell sums of an evaluation (drafter x temperature x domain) and the metrics derived from them."""

from __future__ import annotations

from dataclasses import dataclass, field

from serve_eval.decoding import Generation


@dataclass
class Tally:
    """Sums over the prompts of one drafter x temperature x domain cell."""

    prompts: int = 0
    drafted: int = 0
    accepted: int = 0
    committed: int = 0
    forwards: int = 0
    spec_s: float = 0.0
    spec_tokens: int = 0
    base_s: float = 0.0
    base_tokens: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    mismatches: int = 0
    peer_s: float = 0.0
    peer_tokens: int = 0
    position_drafted: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    committed_per_step: dict[int, int] = field(default_factory=dict)

    def add(self, spec: Generation, base: Generation) -> None:
        self.prompts += 1
        self.drafted += spec.drafted
        self.accepted += spec.accepted
        self.committed += len(spec.new_ids)
        self.forwards += spec.verifier_forwards
        self.spec_s += spec.wall_s
        self.spec_tokens += len(spec.new_ids)
        self.base_s += base.wall_s
        self.base_tokens += len(base.new_ids)
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

    def metrics(self) -> dict:
        tokens_per_s = self.spec_tokens / max(self.spec_s, 1e-9)
        baseline_tokens_per_s = self.base_tokens / max(self.base_s, 1e-9)
        out = {
            "acceptance_rate": self.accepted / max(1, self.drafted),
            "tau": self.committed / max(1, self.forwards),
            "speedup": tokens_per_s / baseline_tokens_per_s,
            "tokens_per_s": tokens_per_s,
            "baseline_tokens_per_s": baseline_tokens_per_s,
            "draft_time_s": self.draft_s,
            "verify_time_s": self.verify_s,
            "per_position_acceptance": [a / d for a, d in zip(self.position_accepted, self.position_drafted)],
            "prompts": self.prompts,
        }
        if self.peer_tokens:
            peer_tokens_per_s = self.peer_tokens / max(self.peer_s, 1e-9)
            out["hf_assisted_tokens_per_s"] = peer_tokens_per_s
            out["ours_vs_hf_assisted"] = tokens_per_s / peer_tokens_per_s
        return out
