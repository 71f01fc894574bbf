"""vLLM-only reproduction: sampled speculative decoding on the CPU build accepts almost no draft.

With the draft model identical to the target and drafts sampled from the draft's own distribution
(`draft_sample_method: probabilistic`), lossless rejection sampling accepts every draft at any
temperature: τ (1 + accepted drafts per drafting step) must be k + 1. vLLM 0.32's CPU build gets
k + 1 greedy but τ ≈ 1 at T = 0.8: the rejection sampler's per-token temperature / top_k / top_p come
from the CPU fallback of the Triton `expand_kernel` (`vllm/utils/cpu_triton_utils.py`,
`_expand_kernel_impl`), which writes an int64 copy of a float32/int32 output and never the output,
so the target logits are divided by uninitialised memory. draftline's vLLM plugin
(`serve_eval/vllm_plugin/`, installed by `make serve-env`) replaces that fallback when its self-test
finds it broken. The script builds a tiny random Qwen3 model (no download) and patches nothing
itself: run it with the plugin, and without it through vLLM's own plugin filter. Usage (vLLM
environment, no draftline needed):

    .venv-serve/bin/python -I serve_eval/repro/sampled_draft_eq_target.py                  # plugin loaded
    VLLM_PLUGINS= .venv-serve/bin/python -I serve_eval/repro/sampled_draft_eq_target.py    # no plugin

Exit code 1 when the sampled τ is not k + 1 (the defect), 0 when greedy and sampled τ both are.
"""

import os
import sys
import tempfile

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS, K = 512, 128, 4, 2, 32, 256, 2, 3
PROMPTS, NEW_TOKENS, TEMPERATURE = 8, 48, 0.8
# draft == target computes the same logits up to float noise in a different batch shape: every draft but
# a rare near-tie is accepted, so τ stays within this of k + 1 (the defect gives τ ≈ 1)
TAU_SLACK = 0.05
DRAFTS, ACCEPTED = "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens"


def build_model(path: str) -> str:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                         max_position_embeddings=512, tie_word_embeddings=False)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():  # wide enough logits that T = 0.8 samples many different tokens
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, 0.1)
    model.save_pretrained(path)
    return path


def counters(llm) -> dict:
    totals: dict = {}
    for metric in llm.get_metrics():
        if metric.name in (DRAFTS, ACCEPTED):
            totals[metric.name] = totals.get(metric.name, 0) + int(metric.value)
    return totals


def tau(llm, prompts: list, temperature: float) -> float:
    from vllm import SamplingParams

    before = counters(llm)
    params = [SamplingParams(temperature=temperature, seed=i, max_tokens=NEW_TOKENS, ignore_eos=True, detokenize=False)
              for i in range(len(prompts))]
    llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
    after = counters(llm)
    drafts = after.get(DRAFTS, 0) - before.get(DRAFTS, 0)
    return 1 + (after.get(ACCEPTED, 0) - before.get(ACCEPTED, 0)) / drafts if drafts else float("nan")


def main() -> int:
    import torch
    from vllm import LLM

    model = build_model(tempfile.mkdtemp(prefix="sampled_repro_"))
    llm = LLM(model=model, skip_tokenizer_init=True, dtype="float32", max_model_len=256, enforce_eager=True, seed=0,
              disable_log_stats=False,  # the spec-decode counters come from the stat loggers
              speculative_config={"method": "draft_model", "model": model, "num_speculative_tokens": K,
                                  "draft_sample_method": "probabilistic"})
    generator = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, VOCAB - 2, (int(n),), generator=generator).tolist()
               for n in torch.randint(8, 24, (PROMPTS,), generator=generator)]
    greedy, sampled = tau(llm, prompts, 0.0), tau(llm, prompts, TEMPERATURE)
    print(f"draft == target, k = {K}, {PROMPTS} prompts x {NEW_TOKENS} tokens: tau greedy {greedy:.3f}, "
          f"T={TEMPERATURE} {sampled:.3f} (lossless sampling: {K + 1} at both)")
    if not sampled >= K + 1 - TAU_SLACK:  # NaN (no drafts) fails too
        print(f"DEFECT: at T={TEMPERATURE} vLLM rejects drafts identical to the target: the rejection sampler's "
              "per-token temperature is not what the request asked (the CPU expand fallback leaves it unwritten)")
        return 1
    if not greedy >= K + 1 - TAU_SLACK:
        print("greedy tau is not k + 1 either: something other than the sampled-path defect is wrong")
        return 1
    print(f"no defect: every draft accepted at T=0 and T={TEMPERATURE}")
    return 0


if __name__ == "__main__":  # vLLM's engine-core process may re-import this file
    sys.exit(main())
