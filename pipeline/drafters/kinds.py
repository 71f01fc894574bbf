"""Every drafter kind by name. A new kind: its package under pipeline/drafters/ and one line here
(and its name in `pipeline.config.base.DrafterName`)."""

from __future__ import annotations

from pipeline.drafters.ar.kind import AR
from pipeline.drafters.block.kind import BLOCK
from pipeline.drafters.eagle3.kind import EAGLE3
from pipeline.drafters.interface import DrafterKind

KINDS: dict[str, DrafterKind] = {kind.name: kind for kind in (AR, BLOCK, EAGLE3)}
