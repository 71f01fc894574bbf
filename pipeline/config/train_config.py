"""`train`: one subsection per drafter kind, each defined in its kind's package."""

from __future__ import annotations

from pipeline.config.base import Section
from pipeline.drafters.ar.config import ARDrafterConfig
from pipeline.drafters.block.config import BlockDrafterConfig
from pipeline.drafters.eagle3.config import Eagle3DrafterConfig


class TrainConfig(Section):
    ar: ARDrafterConfig = ARDrafterConfig()
    block: BlockDrafterConfig = BlockDrafterConfig()
    eagle3: Eagle3DrafterConfig = Eagle3DrafterConfig()
