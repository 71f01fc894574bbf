"""KV-cache helpers on top of transformers' `DynamicCache`."""

from __future__ import annotations

from transformers import DynamicCache


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Keep the first `length` cached positions (transformers 5 `crop` takes a negative count)."""
    extra = cache.get_seq_length() - length
    if extra < 0:
        raise ValueError(f"cannot crop a cache of {cache.get_seq_length()} tokens to {length}")
    if extra:
        cache.crop(-extra)
