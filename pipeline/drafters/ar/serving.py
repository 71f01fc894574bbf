"""The AR drafter as serving stacks load it: a plain HF Qwen3/Llama causal LM draft model.

vLLM (`method: draft_model`), SGLang (`STANDALONE`) and TensorRT-LLM (`Draft_Target`) read it as an
ordinary causal LM with the verifier's tokenizer; k comes from `train.ar.draft_tokens` as trained.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.drafters.interface import Launch
from pipeline.drafters.served_checks import (
    check_plain_autoconfig,
    layer_weights,
    read_config,
    require_keys,
    require_rope_theta,
    require_tokenizer,
    require_weights,
    trained_draft_tokens,
    trtllm_serve,
    vllm_section,
    weight_names,
)

CONFIG_KEYS = ("architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps")


def serving_layout(directory: Path) -> dict:
    """The copied checkpoint as draft-model loaders read it (nothing to rewrite). Returns the config."""
    config = read_config(directory)
    require_keys(directory, config, CONFIG_KEYS)
    require_rope_theta(directory, config)
    names = weight_names(directory)
    required = ["model.embed_tokens.weight", "model.norm.weight"]
    if not config.get("tie_word_embeddings", False):
        required.append("lm_head.weight")
    required += layer_weights("model.layers.", int(config["num_hidden_layers"]), config["model_type"] == "qwen3")
    require_weights(directory, names, required)
    require_tokenizer(directory)
    check_plain_autoconfig(directory, str(config["model_type"]))
    return config


def draft_tokens(drafter_dir: Path) -> int:
    return trained_draft_tokens(drafter_dir, "ar")


def launch(served_config: dict, verifier: str, draft: Path, drafter_dir: Path) -> Launch:
    k = draft_tokens(drafter_dir)
    speculative = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": k,
                   "draft_sample_method": "probabilistic"}
    markdown = f"""# Serving the AR drafter

Draft model: `{draft}` (a plain HF causal LM with the verifier's tokenizer).
Target (verifier): `{verifier}`. Draft tokens per step k = {k} (`train.ar.draft_tokens`, as trained).

{vllm_section(verifier, speculative)}
## SGLang (standalone draft model)

Not run here; checked against SGLang's loader code (sgl-project/sglang@d9ccf6a
`python/sglang/srt/arg_groups/speculative_hook.py`: STANDALONE loads the draft as a plain causal LM).

```bash
python -m sglang.launch_server --model-path {verifier} \\
  --speculative-algorithm STANDALONE \\
  --speculative-draft-model-path {draft} \\
  --speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}
```

## TensorRT-LLM (DraftTargetDecodingConfig)

Not run here; checked against TensorRT-LLM's config class (NVIDIA/TensorRT-LLM@7c7504c
`tensorrt_llm/llmapi/llm_args.py`: `decoding_type: Literal["Draft_Target"]`).

`spec.yaml`:

```yaml
speculative_config:
  decoding_type: Draft_Target
  max_draft_len: {k}
  speculative_model: {draft}
```

{trtllm_serve(verifier)}"""
    return Launch(markdown, speculative, "draft-simple")
