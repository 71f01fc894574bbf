"""What every section module shares: the strict section base, kind and domain names, and the registry of
checks that span two sections."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Callable, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

# Drafter kinds by name; each has its package under pipeline/drafters/ (kinds.py maps name -> kind).
DrafterName = Literal["ar", "block", "eagle3"]
DRAFTER_NAMES: tuple[str, ...] = get_args(DrafterName)

DEFAULT_PARAMS_PATH = Path("params.yaml")

# The top-level sections of params.yaml; a stage validates only its own, but a misspelt one fails everywhere.
SECTION_NAMES = ("project", "verifier", "corpus", "train", "export", "evaluate", "tracking", "serve_check", "promote")

# A domain is whatever the corpus sources call it; no dots, since metrics are keyed `<domain>.<metric>`.
DOMAIN_PATTERN = r"^[A-Za-z0-9_-]+$"
DomainName = Annotated[str, StringConstraints(pattern=DOMAIN_PATTERN)]
# Seeds feed torch generators (uint64) after offsets and products (`seed * 100_003 + epoch`) and Lightning's
# seed_everything (uint32, which silently picks a random seed past it): the uint32 range keeps all of them valid.
SEED_MAX = 2**32 - 1
Seed = Annotated[int, Field(ge=0, le=SEED_MAX)]

# The built-in sources' domain when they name none.
STDLIB_DOMAINS = {"stdlib_code": "code", "stdlib_text": "text"}


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
