"""`train.dspark`: the block drafter plus DSpark's heads, so sampled drafts follow the token before them."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, StrictBool

from pipeline.config.section import cross_check
from pipeline.drafters.block.config import (
    BlockFamilyConfig,
    BlockLossConfig,
    check_target_layers,
    feature_layers,  # noqa: F401  every kind's config names the layers its drafter reads (features_config.py)
)


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
    # The verifier's distribution (forward KL) on every path: the Markov head must learn what follows a sampled
    # token, and sampled drafts are accepted by how close the draft distribution is to the verifier's; argmax CE
    # at 0.1 beside it gives back the greedy τ forward KL alone gives up. python -m train.dspark_bench on the demo
    # (500 steps, 12 prompts a domain, 64 tokens, AVX2 kernels), τ code / text against forward KL alone:
    # T=0 3.75 / 4.24 vs 3.32 / 3.46 (the plain block drafter 3.37 / 4.09), T=0.8 2.60 / 2.72 vs 2.52 / 2.62;
    # CE at 0.25: T=0 3.88 / 4.68 but T=0.8 2.43 / 2.47; CE at 1 (measured earlier) T=0.8 1.84 / 1.96.
    loss: BlockLossConfig = BlockLossConfig(ce=0.1, fkl=1.0, greedy_chain=False)


@cross_check("train", "verifier")
def _dspark_target_layers_exist(params) -> None:
    check_target_layers(params, DSparkDrafterConfig.kind)
