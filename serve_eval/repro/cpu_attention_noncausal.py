"""vLLM-only check: the CPU attention kernel's non-causal path, several requests per batch, against SDPA.

A DFlash drafter's query block (bonus token + k masks) attends non-causally to its context and itself.
This runs `cpu_attention_with_kv_cache` the way vLLM's CPU backend does for such a batch (8 queries per
request over paged K/V, causal off) and compares every request's output with PyTorch SDPA on the same
tensors, for single and batched requests, contexts of 30-100 tokens, split-KV on and off, pages of
16/32/128 tokens. It ruled the kernel out as the cause of the block drafter's batched τ loss (the
cause is the drafter skip at max_model_len: `dflash_drafter_skip.py`). Usage (vLLM environment):

    .venv-serve/bin/python -I serve_eval/repro/cpu_attention_noncausal.py

Exit code 1 if any output is off by more than 1e-4.
"""

import sys

import torch
from vllm import _custom_ops as ops
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

HEADS, KV_HEADS, HEAD_DIM, QUERIES = 4, 2, 32, 8  # the demo drafter's shapes, k = 7
CONTEXTS = ([30], [51], [30, 30], [50, 51], [30, 51], [100, 100], [30] * 8, [30, 36, 37, 38, 40, 42, 50, 51])


def max_error(contexts: list, page: int, causal: bool, split_kv: bool) -> float:
    isa = _get_attn_isa(torch.float32, page, HEAD_DIM)
    generator = torch.Generator().manual_seed(0)
    lengths = [c + QUERIES for c in contexts]
    pages = sum((n + page - 1) // page for n in lengths)
    key_cache, value_cache = torch.zeros(pages, KV_HEADS, page, HEAD_DIM), torch.zeros(pages, KV_HEADS, page, HEAD_DIM)
    table = torch.zeros(len(lengths), pages, dtype=torch.int32)
    keys, values, queries, slots, used = [], [], [], [], 0
    for row, n in enumerate(lengths):
        count = (n + page - 1) // page
        table[row, :count] = torch.arange(used, used + count, dtype=torch.int32)
        used += count
        keys.append(torch.randn(n, KV_HEADS, HEAD_DIM, generator=generator))
        values.append(torch.randn(n, KV_HEADS, HEAD_DIM, generator=generator))
        queries.append(torch.randn(QUERIES, HEADS, HEAD_DIM, generator=generator))
        slots += [int(table[row, i // page]) * page + i % page for i in range(n)]
    ops.cpu_attn_reshape_and_cache(torch.cat(keys), torch.cat(values), key_cache, value_cache,
                                   torch.tensor(slots, dtype=torch.int64), isa)
    query = torch.cat(queries)
    output = torch.empty_like(query)
    starts = torch.arange(len(lengths) + 1, dtype=torch.int32) * QUERIES
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    metadata = ops.cpu_attn_get_scheduler_metadata(len(lengths), HEADS, KV_HEADS, HEAD_DIM, seq_lens, torch.float32,
                                                   starts, causal, -1, isa, split_kv)
    ops.cpu_attention_with_kv_cache(query, key_cache, value_cache, output, starts, seq_lens, HEAD_DIM ** -0.5, causal,
                                    None, -1, table, 0.0, metadata, None)
    worst = 0.0
    for row, n in enumerate(lengths):
        groups = HEADS // KV_HEADS
        k = keys[row].transpose(0, 1).repeat_interleave(groups, 0)
        v = values[row].transpose(0, 1).repeat_interleave(groups, 0)
        mask = torch.arange(n)[None, :] <= torch.arange(QUERIES)[:, None] + n - QUERIES if causal else None
        reference = torch.nn.functional.scaled_dot_product_attention(queries[row].transpose(0, 1), k, v,
                                                                     attn_mask=mask).transpose(0, 1)
        worst = max(worst, float((output[starts[row]:starts[row + 1]] - reference).abs().max()))
    return worst


def main() -> int:
    failures = 0
    for page in (16, 32, 128):
        for causal in (False, True):
            for split_kv in (True, False):
                errors = [max_error(contexts, page, causal, split_kv) for contexts in CONTEXTS]
                failures += sum(error > 1e-4 for error in errors)
                print(f"page {page:3d} causal {causal!s:5} split_kv {split_kv!s:5}: max |out - SDPA| {max(errors):.1e}")
    print("all within 1e-4" if not failures else f"{failures} batches off by more than 1e-4")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
