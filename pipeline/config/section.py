"""The strict base of every params section, and the registry of checks that span two sections.

Apart from base.py so that a kind's `train.<kind>` section (pipeline/drafters/<kind>/config.py) can build on
it while base.py takes the kind names from the kinds' registry, which imports those sections."""

from __future__ import annotations

from typing import Callable

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    # inf/nan would silently disable a threshold (`atol: .inf`, `min_speedup: .inf`).
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def unique(value: list, what: str = "entries") -> list:
    """`[ar, ar]` would run (and register) the same drafter twice."""
    duplicates = sorted({str(item) for item in value if value.count(item) > 1})
    if duplicates:
        raise ValueError(f"duplicate {what} {duplicates}")
    return value


# (sections it reads, check): run by every StageParams that holds all of those sections. A check lives
# in the module of the section it guards and registers itself on import.
CrossCheck = Callable[[BaseModel], None]
CROSS_CHECKS: list[tuple[tuple[str, ...], CrossCheck]] = []


def cross_check(*sections: str) -> Callable[[CrossCheck], CrossCheck]:
    def register(check: CrossCheck) -> CrossCheck:
        CROSS_CHECKS.append((sections, check))
        return check
    return register
