"""vLLM-only reproduction: a DFlash drafter loses context when a co-batched request nears max_model_len.

vLLM (checked: 0.32.0, CPU build; the decision is in the shared `v1/worker/gpu_model_runner.py`, so
every backend) decides once per engine step whether the drafter runs:
`_input_fits_in_drafter` requires `max_seq_len + num_speculative_tokens + 1 <= max_model_len` for the
*batch's* longest sequence. When one request is within a block of max_model_len, no request in the
batch drafts that step; and the DFlash proposer writes the drafter's context K/V (projected target
hidden states) only when it runs, so the tokens verified in a skipped step never enter the other
requests' drafter caches. Those requests keep drafting over a context with holes until they finish:
their drafts differ from the same request served alone, and acceptance drops (outputs stay correct).

The script builds a tiny random Qwen3 target and DFlash drafter (no download, no training), then
serves a short prompt alone and together with a long prompt that reaches max_model_len first, and
compares the short request's drafts step by step. Usage (vLLM environment, no draftline needed):

    VLLM_ENABLE_V1_MULTIPROCESSING=0 .venv-serve/bin/python -I serve_eval/repro/dflash_drafter_skip.py

Exit code 1 when the defect shows (the short request's drafts differ once batched), 0 otherwise.
"""

import json
import os
import sys
import tempfile

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the proposer patch below must run in-process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, TARGET_LAYERS, K = 512, 128, 4, 2, 32, 256, 4, 7
SHORT, LONG, SHORT_NEW, LONG_NEW = 12, 60, 40, 24


def build_models(root: str) -> tuple[str, str]:
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=TARGET_LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                         max_position_embeddings=512, tie_word_embeddings=False)
    target = Qwen3ForCausalLM(config)
    with torch.no_grad():  # peaked logits: argmax drafts do not flip on float noise
        for parameter in target.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, 0.1)
    target.save_pretrained(f"{root}/target")
    draft = {**config.to_dict(), "architectures": ["DFlashDraftModel"], "num_hidden_layers": 1, "block_size": K + 1,
             "num_target_layers": TARGET_LAYERS, "layer_types": ["full_attention"], "use_sliding_window": False,
             "dflash_config": {"mask_token_id": VOCAB - 1, "target_layer_ids": [1, 2], "block_size": K + 1}}
    generator = torch.Generator().manual_seed(1)

    def weight(*shape):
        return (torch.randn(*shape, generator=generator) * 0.1).contiguous()

    layer = "layers.0."
    weights = {layer + "self_attn.q_proj.weight": weight(HEADS * HEAD_DIM, HIDDEN),
               layer + "self_attn.k_proj.weight": weight(KV_HEADS * HEAD_DIM, HIDDEN),
               layer + "self_attn.v_proj.weight": weight(KV_HEADS * HEAD_DIM, HIDDEN),
               layer + "self_attn.o_proj.weight": weight(HIDDEN, HEADS * HEAD_DIM),
               layer + "self_attn.q_norm.weight": torch.ones(HEAD_DIM), layer + "self_attn.k_norm.weight": torch.ones(HEAD_DIM),
               layer + "mlp.gate_proj.weight": weight(FFN, HIDDEN), layer + "mlp.up_proj.weight": weight(FFN, HIDDEN),
               layer + "mlp.down_proj.weight": weight(HIDDEN, FFN), layer + "input_layernorm.weight": torch.ones(HIDDEN),
               layer + "post_attention_layernorm.weight": torch.ones(HIDDEN),
               "fc.weight": weight(HIDDEN, 2 * HIDDEN), "hidden_norm.weight": torch.ones(HIDDEN),
               "norm.weight": torch.ones(HIDDEN)}
    os.makedirs(f"{root}/draft")
    save_file(weights, f"{root}/draft/model.safetensors")
    with open(f"{root}/draft/config.json", "w", encoding="utf-8") as handle:
        json.dump(draft, handle)
    return f"{root}/target", f"{root}/draft"


def main() -> int:
    import torch
    from vllm import LLM, SamplingParams
    from vllm.v1.spec_decode import dflash

    drafts: list = []  # per drafting step: (committed length of batch row 0, its drafts)
    propose = dflash.DFlashProposer.propose

    def recording(self, *args, **kwargs):
        out = propose(self, *args, **kwargs)
        rejected = kwargs.get("num_rejected_tokens_gpu")
        length = int(kwargs["common_attn_metadata"].seq_lens[0]) - (0 if rejected is None else int(rejected[0]))
        drafts.append((length, out[0].tolist()))
        return out

    dflash.DFlashProposer.propose = recording
    target, draft = build_models(tempfile.mkdtemp(prefix="dflash_repro_"))
    max_model_len = LONG + LONG_NEW + K + 1  # the long request ends right at the limit
    llm = LLM(model=target, skip_tokenizer_init=True, dtype="float32", max_model_len=max_model_len, enforce_eager=True,
              seed=0, speculative_config={"method": "dflash", "model": draft, "num_speculative_tokens": K})
    generator = torch.Generator().manual_seed(2)
    short, long = (torch.randint(0, VOCAB - 2, (n,), generator=generator).tolist() for n in (SHORT, LONG))

    def params(n):
        return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)

    drafts.clear()
    alone = llm.generate([{"prompt_token_ids": short}], params(SHORT_NEW), use_tqdm=False)[0]
    alone_drafts = dict(drafts)
    drafts.clear()
    together = llm.generate([{"prompt_token_ids": short}, {"prompt_token_ids": long}],
                            [params(SHORT_NEW), params(LONG_NEW)], use_tqdm=False)[0]
    batched_drafts = dict(drafts)  # the short request is row 0 of every step
    same_output = list(alone.outputs[0].token_ids) == list(together.outputs[0].token_ids)
    skipped = sorted(set(alone_drafts) - set(batched_drafts))
    differing = sorted(n for n in set(alone_drafts) & set(batched_drafts) if alone_drafts[n] != batched_drafts[n])
    print(f"short request ({SHORT} prompt tokens, {SHORT_NEW} new) next to a long one ({LONG} + {LONG_NEW}), "
          f"max_model_len {max_model_len}: outputs identical {same_output}; drafting steps alone {len(alone_drafts)}, "
          f"batched {len(batched_drafts)}")
    print(f"  drafter skipped for the short request at committed lengths {skipped}")
    print(f"  drafts differing from the request served alone at committed lengths {differing}")
    if skipped or differing:
        print("DEFECT: co-batched with a request near max_model_len, the DFlash drafter skips steps and then drafts "
              "from a context missing the skipped steps' tokens")
        return 1
    print("no difference: the short request drafts the same alone and batched")
    return 0


if __name__ == "__main__":
    sys.exit(main())
