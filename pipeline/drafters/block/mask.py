"""Which vocabulary id marks the masked slots of a block.

Serving stacks (vLLM `method: dflash`, SGLang `DFLASH`, TensorRT-LLM `DFlashDecodingConfig`) embed
`dflash_config.mask_token_id` with the verifier's own frozen embedding table, so a servable drafter
needs *an id*, not a dedicated token: the embedding only marks the slots, positions tell them apart.
Many full vocabularies (most Llama-family tokenizers) have no `<|mask|>`, so `auto` falls back, in
order, to a reserved/unused special token, the pad or unk token, and finally the id seen least often
in the training corpus; never an id the verifier ends or starts text with.

Design: docs/algorithms.md#block-drafter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow.compute as pc
from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pipeline.errors import DraftlineError
from pipeline.integrity import mask_token_id as tokenizer_mask_id
from pipeline.integrity import stop_token_ids

RESERVED = re.compile(r"reserved|unused", re.IGNORECASE)


@dataclass(frozen=True)
class MaskChoice:
    token_id: int
    rule: str  # why this id: said at training start, kept in the drafter config and launch.md

    def describe(self, tokenizer: PreTrainedTokenizerBase) -> str:
        return f"{self.token_id} ({tokenizer.convert_ids_to_tokens(self.token_id)!r}: {self.rule})"


def _never_mask(tokenizer: PreTrainedTokenizerBase, end_ids: list[int]) -> set[int]:
    """Ids that start or end text: masking with one would make a block look finished or restarted."""
    ids = {tokenizer.bos_token_id, tokenizer.eos_token_id, *end_ids}
    return {int(i) for i in ids if i is not None}


def corpus_token_counts(train: Dataset, vocab_size: int) -> np.ndarray:
    table = train.data.table
    ids = [pc.list_flatten(table.column(column)).to_numpy() for column in ("prompt_ids", "response_ids")]
    return np.bincount(np.concatenate(ids).astype(np.int64), minlength=vocab_size)[:vocab_size]


def choose_mask(tokenizer: PreTrainedTokenizerBase, vocab_size: int, end_ids: list[int], train: Dataset,
                ) -> MaskChoice:
    """The first servable id by rule; the training corpus is counted only when no special id is free."""
    own = tokenizer_mask_id(tokenizer)
    if own is not None:
        return MaskChoice(int(own), "the tokenizer's mask token")
    taken = _never_mask(tokenizer, end_ids)
    reserved = sorted(
        token_id for token_id, token in tokenizer.added_tokens_decoder.items()
        if token.special and RESERVED.search(token.content) and token_id < vocab_size and token_id not in taken
    )
    if reserved:
        return MaskChoice(reserved[0], "a reserved special token")
    for name in ("pad", "unk"):
        token_id = getattr(tokenizer, f"{name}_token_id")
        if token_id is not None and token_id < vocab_size and token_id not in taken:
            return MaskChoice(int(token_id), f"the {name} token")
    counts = corpus_token_counts(train, vocab_size).astype(np.float64)
    counts[[i for i in taken | set(tokenizer.all_special_ids) if i < vocab_size]] = np.inf
    rarest = int(np.argmin(counts))  # the lowest id among equally rare ones
    return MaskChoice(rarest, f"the rarest id in the training corpus, {int(counts[rarest])} occurrences")


def resolve_mask(mode: str, verifier: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, train: Dataset,
                 kind: str) -> MaskChoice | None:
    """`train.<kind>.mask` made concrete for this verifier: a MaskChoice, or None for a learned mask embedding."""
    if mode == "learned":
        return None
    if mode == "token" and tokenizer_mask_id(tokenizer) is None:
        raise DraftlineError(f"train.{kind}.mask is 'token' but the verifier's tokenizer has no mask token; "
                             f"set train.{kind}.mask to 'auto' (an existing id chosen by rule)")
    vocab_size = int(verifier.config.get_text_config().vocab_size)
    return choose_mask(tokenizer, vocab_size, stop_token_ids(verifier.generation_config, tokenizer), train)
