"""Engine `hf`: the verifier in this process, batched with a KV cache (`data_prep.continuation`)."""

from __future__ import annotations

from typing import Callable, Sequence

import transformers

from data_prep.continuation import generate_batch
from data_prep.engines import Request, Result
from pipeline.integrity import stop_token_ids


class HFEngine:
    def __init__(self, model, tokenizer, batch_size: int):
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size

    def describe(self) -> dict:
        return {"name": "hf", "version": f"transformers {transformers.__version__}", "batch_size": self.batch_size}

    def generate(self, requests: Sequence[Request], on_done: Callable[[int], None]) -> list[Result]:
        # One batch shares one sampling config and length budget, so requests are grouped by them
        # (order kept inside a group); a prompt's continuation does not depend on its batch mates.
        groups: dict[tuple, list[int]] = {}
        for index, request in enumerate(requests):
            key = (tuple(request.sampling.model_dump().items()), request.max_new_tokens)
            groups.setdefault(key, []).append(index)
        results: list[Result | None] = [None] * len(requests)
        for indices in groups.values():
            for start in range(0, len(indices), self.batch_size):
                batch = [requests[i] for i in indices[start : start + self.batch_size]]
                continuations = generate_batch(
                    self.model, [r.prompt_ids for r in batch], max_new_tokens=batch[0].max_new_tokens,
                    eos_token_id=stop_token_ids(self.model.generation_config, self.tokenizer),
                    pad_token_id=self.tokenizer.pad_token_id,
                    sampling=batch[0].sampling, seeds=[r.seed for r in batch],
                )
                for index, request, continuation in zip(indices[start:], batch, continuations):
                    results[index] = Result(list(request.prompt_ids), continuation.response_ids,
                                            continuation.finish_reason)
                on_done(len(batch))
        return results
