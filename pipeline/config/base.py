"""Names every section module shares: drafter kinds, sections, domains (the section base: section.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from pipeline.drafters.registry import KIND_SPECS

# Drafter kinds by name, as the registry lists them; each has its package under pipeline/drafters/.
DRAFTER_NAMES: tuple[str, ...] = tuple(KIND_SPECS)
DrafterName = Literal[DRAFTER_NAMES]  # type: ignore[valid-type]  # built from the registry at import

DEFAULT_PARAMS_PATH = Path("params.yaml")

# The top-level sections of params.yaml; a stage validates only its own, but a misspelt one fails everywhere.
SECTION_NAMES = ("project", "verifier", "corpus", "features", "train", "export", "evaluate", "tracking", "serve_check", "promote")

# A domain is whatever the corpus sources call it; no dots, since metrics are keyed `<domain>.<metric>`.
DOMAIN_PATTERN = r"^[A-Za-z0-9_-]+$"
DomainName = Annotated[str, StringConstraints(pattern=DOMAIN_PATTERN)]
# Seeds feed torch generators (uint64) after offsets and products (`seed * 100_003 + epoch`) and Lightning's
# seed_everything (uint32, which silently picks a random seed past it): the uint32 range keeps all of them valid.
SEED_MAX = 2**32 - 1
Seed = Annotated[int, Field(ge=0, le=SEED_MAX)]

# The built-in sources' domain when they name none.
STDLIB_DOMAINS = {"stdlib_code": "code", "stdlib_text": "text"}
