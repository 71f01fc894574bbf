"""`train.dspark`: the block drafter plus DSpark's heads, so sampled drafts follow the token before them."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, StrictBool

from pipeline.config.section import cross_check
from pipeline.drafters.block.config import BlockFamilyConfig, BlockLossConfig, check_target_layers
# every kind's config module names the verifier layers its drafter reads (pipeline/config/features_config.py)
from pipeline.drafters.block.config import feature_layers  # noqa: F401  the block family's rule


class DSparkDrafterConfig(BlockFamilyConfig):
    """The DFlash pass of `train.block`'s family plus a Markov head (and a confidence head): every field the
    block kind has, with the same meaning, plus these two."""

    kind: ClassVar[str] = "dspark"

    markov_rank: int = Field(
        64, ge=1, le=4096, description="rank r of the Markov head (V x r embedding of the previous block token, "
        "r x V projection) whose bias is added to each position's logits, drafted left to right: position k's "
        "draft then depends on the token drafted at k-1, which is what a sampled verifier checks",
    )
    confidence_head: StrictBool = Field(
        True, description="a per-position acceptance estimate (vLLM's confidence_head), trained on the detached "
        "drafter: decoding may cut a block short with evaluate.confidence_threshold > 0",
    )
    # every path, not only the verifier's greedy chain: the Markov head must learn what follows a sampled
    # token, which is what it conditions on when drafting at T > 0 (the plain block drafter has no such input)
    loss: BlockLossConfig = BlockLossConfig(greedy_chain=False)


@cross_check("train", "verifier")
def _dspark_target_layers_exist(params) -> None:
    check_target_layers(params, DSparkDrafterConfig.kind)
