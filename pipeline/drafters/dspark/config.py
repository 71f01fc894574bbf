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
    # The verifier's distribution (forward KL) on every path, no argmax CE: the Markov head must learn what follows
    # a sampled token, and sampled drafts are accepted by how close the draft distribution is to the verifier's.
    # python -m train.dspark_bench on the demo (500 steps, 8 prompts a domain): T=0.8 τ code / text 2.43 / 2.57,
    # speedup 1.04x / 1.10x, against 1.84 / 1.96 and 0.74x / 0.88x with argmax CE beside it; T=0 τ 2.78 / 4.08
    # against 3.37 / 4.92: the greedy specialist is the plain block drafter, this kind is for sampled serving.
    loss: BlockLossConfig = BlockLossConfig(ce=0.0, fkl=1.0, greedy_chain=False)


@cross_check("train", "verifier")
def _dspark_target_layers_exist(params) -> None:
    check_target_layers(params, DSparkDrafterConfig.kind)
