"""The rejection sampler's `expand_kernel` in torch, and a self-test of any implementation of it.

vLLM's rejection sampler expands each request's temperature (float32), top_k (int32) and top_p
(float32) to one value per draft token through the Triton `expand_kernel`. vLLM 0.32's CPU fallback
for it (`vllm/utils/cpu_triton_utils.py`, `_expand_kernel_impl`) hands the int64-only C++ op an int64
*copy* of a float32/int32 output and never writes the output itself, so sampled speculation divides
the target logits by uninitialised memory. Copying back would not do either: 0.8 -> int64 -> 0.
"""

from __future__ import annotations

import torch

# the launch the rejection sampler makes: 2 requests with 2 and 1 draft tokens, values equal to
# replace_from (0) replaced by replace_to (1), as for a greedy request's temperature
SELF_TEST_CU = (2, 3)
SELF_TEST_CASES = ((torch.float32, (0.8, 0.0), (0.8, 0.8, 1.0)),  # temperature, top_p
                   (torch.int32, (50, 0), (50, 50, 1)))  # top_k


def expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """`expand_kernel`'s contract (one program per request, writes `output` in place) in the output's dtype:
    request i's value, `replace_from` swapped for `replace_to`, repeated over its draft tokens."""
    cu = cu_num_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    values = input_val[: cu.numel()]
    values = torch.where(values == replace_from, torch.as_tensor(replace_to, dtype=values.dtype), values)
    total = int(cu[-1]) if cu.numel() else 0
    output[:total].copy_(torch.repeat_interleave(values, counts).to(output.dtype))


def self_test(impl) -> str | None:
    """None when `impl` expands float32 and int32 values correctly, else what it did instead."""
    cu = torch.tensor(SELF_TEST_CU, dtype=torch.int32)
    for dtype, values, expected in SELF_TEST_CASES:
        output = torch.full((len(expected),), -7, dtype=dtype)
        try:
            impl(output, torch.tensor(values, dtype=dtype), cu, 0, 1)
        except Exception as error:  # a fallback that cannot run at all is as broken as one that writes nothing
            return f"{dtype} raised {type(error).__name__}: {error}"
        if not torch.equal(output, torch.tensor(expected, dtype=dtype)):
            return f"{dtype} {list(values)} expanded to {output.tolist()}, not {list(expected)}"
    return None
