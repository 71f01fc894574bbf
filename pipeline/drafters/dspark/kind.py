"""The DSpark drafter kind: the block drafter's pass plus a Markov head, exported as vLLM's
`Qwen3DSparkModel` (`method: dspark`) and llama.cpp's `draft-dspark`. Its code is the block family's
(pipeline/drafters/block/): the checkpoint's `markov_rank` selects every DSpark path there."""

from __future__ import annotations

from pipeline.drafters.block.kind import family_kind
from pipeline.drafters.dspark.spec import DSPARK

KIND = family_kind(DSPARK.name)
