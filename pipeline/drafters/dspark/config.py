"""`train.dspark`: the block drafter plus DSpark's heads, so sampled drafts follow the token before them."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, StrictBool

from pipeline.config.section import cross_check
from pipeline.drafters.block.config import (
    BlockFamilyConfig,
    BlockLossConfig,
    BlockTrainerConfig,
    check_target_layers,
    feature_layers,  # noqa: F401  every kind's config names the layers its drafter reads (features_config.py)
)


# DSpark's own defaults live in subclasses, not in default instances: a partial `loss:` or `trainer:` in
# params.yaml is validated field by field against the class, so it keeps every default it does not name.
class DSparkLossConfig(BlockLossConfig):
    """`train.dspark.loss`: the block loss, defaulting to the verifier's distribution (forward KL) on every path
    with a little argmax CE beside it.

    Forward KL because the Markov head must learn what follows a sampled token and sampled drafts are accepted
    by how close the draft distribution is to the verifier's; argmax CE at 0.1 gives back the greedy τ forward
    KL alone gives up. python -m train.dspark_bench on the demo (500 steps, 12 prompts a domain, 64 tokens, AVX2
    kernels), τ code / text against forward KL alone: T=0 3.75 / 4.24 vs 3.32 / 3.46 (the plain block drafter
    3.37 / 4.09), T=0.8 2.60 / 2.72 vs 2.52 / 2.62; CE at 0.25: T=0 3.88 / 4.68 but T=0.8 2.43 / 2.47; CE at 1
    (measured earlier) T=0.8 1.84 / 1.96.
    """

    ce: float = Field(0.1, ge=0)
    greedy_chain: StrictBool = Field(
        False, description="labels on every path, sampled detours included: the Markov head learns what follows a "
        "sampled token (the block kind's default is True)",
    )


class DSparkTrainerConfig(BlockTrainerConfig):
    """`train.dspark.trainer`: the block trainer with DSpark's learning rate."""

    learning_rate: float = Field(
        6e-3, gt=0, lt=1, description="python -m train.dspark_bench on the demo (500 steps, 12 prompts a domain, "
        "64 tokens, AVX2 kernels), tau code / text at T=0 | T=0.8, seeds 0 and 1: 2e-3 (the block kind's) 3.75 / 4.24 "
        "| 2.60 / 2.72 and 3.54 / 4.34 | 2.57 / 2.69; 4e-3 3.80 / 4.52 | 2.80 / 3.11 and 3.84 / 4.34 | 2.78 / 2.92; "
        "6e-3 3.92 / 4.41 | 2.78 / 3.33 and 3.80 / 4.39 | 2.82 / 3.20; 8e-3 (seed 0) 3.64 / 4.36 | 2.87 / 2.78",
    )


class DSparkDrafterConfig(BlockFamilyConfig):
    """The DFlash pass of `train.block`'s family plus a Markov head (and a confidence head): every field the
    block kind has, with the same meaning, plus these two."""

    kind: ClassVar[str] = "dspark"

    num_layers: int = Field(
        1, ge=1, le=5, description="one layer: at T=0.8 it accepts about as much as two and its pass costs about half. "
        "python -m train.dspark_bench --variants dspark_default dspark_layers2 --prompts 12 --max-new-tokens 64 "
        "--passes 4 on the demo (500 steps, AVX2 kernels), tau code / text (speedup) at T=0.8 2.73 / 3.00 (1.32x / "
        "1.51x) against two layers' 2.76 / 3.07 (1.06x / 1.33x), at T=0 3.46 / 4.22 (1.80x / 2.06x) against 3.92 / "
        "4.41 (1.59x / 1.85x); training 123 s against 172 s",
    )
    markov_rank: int = Field(
        64, ge=1, le=4096, description="rank r of the Markov head (V x r embedding of the previous block token, "
        "r x V projection) whose bias is added to each position's logits, drafted left to right: position k's "
        "draft then depends on the token drafted at k-1, which is what a sampled verifier checks",
    )
    confidence_head: StrictBool = Field(
        True, description="a per-position acceptance estimate (vLLM's confidence_head), trained on the detached "
        "drafter: decoding may cut a block short with evaluate.confidence_threshold > 0",
    )
    loss: DSparkLossConfig = DSparkLossConfig()
    trainer: DSparkTrainerConfig = DSparkTrainerConfig()


@cross_check("train", "verifier")
def _dspark_target_layers_exist(params) -> None:
    check_target_layers(params, DSparkDrafterConfig.kind)
