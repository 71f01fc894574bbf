"""The EAGLE-3 head as serving stacks load it (vLLM `method: eagle3`, SGLang `EAGLE3`, TensorRT-LLM
`Eagle3DecodingConfig`), k drafts per step.

The `config.json` is rewritten for plain transformers `AutoConfig` (draftline's own model type does
not exist there). What vLLM 0.32 reads, from `model_executor/models/llama_eagle3.py`,
`model_executor/models/registry.py` and `v1/worker/gpu_model_runner.py`:
- `architectures: ["LlamaForCausalLMEagle3"]`: the registry maps it to `Eagle3LlamaForCausalLM`, the
  Llama-style head (no q/k norm) draftline trains, whatever the verifier's family. (`Eagle3Qwen3ForCausalLM`
  would build Qwen3 layers with q/k norms this head does not have.)
- `model_type: llama`: AutoConfig builds a LlamaConfig, which keeps the EAGLE-3 keys below.
- `eagle_aux_hidden_state_layer_ids`: the verifier layers vLLM taps (id L = the residual stream entering
  layer L, `hidden_states + residual`); without it vLLM would use (2, n//2, n−3). vLLM reads
  `eagle_config` only when this top-level key is absent; SGLang reads only `eagle_config` and taps the
  *output* of each id there (sgl-project/sglang@bf7a0e2 `models/llama.py` adds 1), so `eagle_config`
  holds L−1 for each L.
- `target_hidden_size` × number of ids = `fc`'s input width; `hidden_size` must equal the verifier's
  (vLLM embeds the draft tokens with the verifier's embedding when the checkpoint has none).
- `draft_vocab_size`: `lm_head` rows; when below `vocab_size` vLLM loads `d2t` (target id = draft id +
  d2t[draft id]) and skips `t2d`.
- `norm_before_residual`: whether the residual is taken after `hidden_norm`.
- `num_hidden_layers` (1), heads, `head_dim`, `intermediate_size`, `rms_norm_eps`, `rope_theta` /
  `rope_parameters`, `max_position_embeddings`: the layer shapes.
Weights: `fc.weight`, `midlayer.*` (vLLM maps it to `layers.0.`), `norm.weight`, `lm_head.weight`, and
`d2t`/`t2d` with a reduced vocabulary; no `embed_tokens` (the verifier's is shared).
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.drafters.interface import Launch
from pipeline.drafters.served_checks import (
    HINT,
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
from pipeline.errors import DraftlineError

ARCHITECTURE = "LlamaForCausalLMEagle3"
CONFIG_KEYS = ("architectures", "model_type", "hidden_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "intermediate_size", "rms_norm_eps", "num_hidden_layers", "vocab_size",
               "draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids", "norm_before_residual")


def served_config(config: dict) -> dict:
    """The EAGLE-3 `config.json` as serving stacks load it (see the module docstring for who reads what)."""
    served = {key: value for key, value in config.items() if key not in ("model_type", "auto_map")}
    layer_ids = list(config["eagle_aux_hidden_state_layer_ids"])
    # SGLang counts a layer's output where vLLM counts its input: the same taps are one id lower there
    served.update(model_type="llama", architectures=[ARCHITECTURE],
                  eagle_config={"eagle_aux_hidden_state_layer_ids": [i - 1 for i in layer_ids],
                                "use_aux_hidden_state": True})
    return served


def serving_layout(serving_dir: Path) -> dict:
    """Rewrite the copied checkpoint's config.json for the serving stacks, then check the layout."""
    path = serving_dir / "config.json"
    config = served_config(json.loads(path.read_text(encoding="utf-8")))
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return check_layout(serving_dir)


def check_layout(directory: Path) -> dict:
    """EAGLE-3 keys; fc, midlayer, norm and lm_head (+ d2t with a reduced vocabulary), no embedding."""
    config = read_config(directory)
    require_keys(directory, config, CONFIG_KEYS)
    require_rope_theta(directory, config)
    if config["model_type"] != "llama" or ARCHITECTURE not in config["architectures"]:
        raise DraftlineError(f"{directory}: a served EAGLE-3 config needs model_type 'llama' and architectures "
                             f"['{ARCHITECTURE}'] (got '{config['model_type']}', {config['architectures']}); {HINT}")
    if int(config["num_hidden_layers"]) != 1:
        raise DraftlineError(f"{directory}: an EAGLE-3 head has 1 layer, config says {config['num_hidden_layers']}; "
                             f"{HINT}")
    layer_ids = config["eagle_aux_hidden_state_layer_ids"]
    if not layer_ids or not all(1 <= int(i) < int(config.get("num_target_layers", 10**9)) for i in layer_ids):
        raise DraftlineError(f"{directory}: eagle_aux_hidden_state_layer_ids {layer_ids} must be non-empty ids in "
                             f"1..num_target_layers−1; {HINT}")
    sglang_ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if sglang_ids != [int(i) - 1 for i in layer_ids]:
        raise DraftlineError(f"{directory}: eagle_config.eagle_aux_hidden_state_layer_ids {sglang_ids} must be the "
                             f"top-level ids minus one, {[int(i) - 1 for i in layer_ids]} (SGLang taps a layer's "
                             f"output); {HINT}")
    names = weight_names(directory)
    required = ["fc.weight", "norm.weight", "lm_head.weight", "midlayer.hidden_norm.weight"]
    required += [name.replace("layers.0.", "midlayer.") for name in layer_weights("layers.", 1, False)]
    if int(config["draft_vocab_size"]) != int(config["vocab_size"]):
        required.append("d2t")
    require_weights(directory, names, required)
    stray = sorted(name for name in names if "embed_tokens" in name)
    if stray:
        raise DraftlineError(f"{directory}: the EAGLE-3 head must not carry '{stray[0]}' (the embedding is the "
                             f"verifier's); {HINT}")
    require_tokenizer(directory)
    check_plain_autoconfig(directory, "llama")
    return config


def unservable_by_sglang_and_trtllm(served: dict) -> list[str]:
    """What SGLang's and TensorRT-LLM's EAGLE-3 loaders cannot express: they load the head without an
    error and draft wrongly, so launch.md gives no snippet for them instead."""
    reasons = []
    if served.get("norm_before_residual"):
        reasons.append("norm_before_residual: true (both always take the residual before hidden_norm: "
                       "sgl-project/sglang@03d5a77 `models/llama_eagle3.py`, NVIDIA/TensorRT-LLM@b35ac1b "
                       "`_torch/models/modeling_speculative.py`)")
    return reasons


def sglang_layer_count_problem(layer_ids: list[int]) -> str | None:
    if len(layer_ids) != 3:
        return (f"{len(layer_ids)} tapped verifier layers, where SGLang's `fc` takes exactly 3 "
                "(sgl-project/sglang@03d5a77 `models/llama_eagle3.py`: `hidden_size_in * 3`); "
                "set three `train.eagle3.aux_layer_ids`")
    return None


def launch(served: dict, verifier: str, draft: Path, drafter_dir: Path) -> Launch:
    k = trained_draft_tokens(drafter_dir, "eagle3")
    layer_ids = [int(i) for i in served["eagle_aux_hidden_state_layer_ids"]]
    speculative = {"method": "eagle3", "model": str(draft), "num_speculative_tokens": k,
                   "draft_sample_method": "probabilistic"}
    blocked = unservable_by_sglang_and_trtllm(served)
    sglang_blocked = blocked + [problem for problem in [sglang_layer_count_problem(layer_ids)] if problem]
    sglang = (f"## SGLang\n\nNo snippet: SGLang cannot serve this head as trained: {'; '.join(sglang_blocked)}.\n"
              if sglang_blocked else f"""## SGLang

Not run here; checked against SGLang's loader code (sgl-project/sglang@03d5a77
`python/sglang/srt/models/llama_eagle3.py`, @bf7a0e2 `models/llama.py`): it reads the tapped layers from
`eagle_config` in config.json, where export wrote them in SGLang's numbering (one less than above).

```bash
python -m sglang.launch_server --model-path {verifier} \\
  --speculative-algorithm EAGLE3 \\
  --speculative-draft-model-path {draft} \\
  --speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}
```
""")
    trtllm = (f"## TensorRT-LLM\n\nNo snippet: TensorRT-LLM cannot serve this head as trained: {'; '.join(blocked)}.\n"
              if blocked else f"""## TensorRT-LLM (Eagle3DecodingConfig)

Not run here; checked against TensorRT-LLM's config class and model (NVIDIA/TensorRT-LLM@7c7504c
`tensorrt_llm/llmapi/llm_args.py`, @b35ac1b `_torch/models/modeling_speculative.py`).
`eagle3_layers_to_capture` counts the *output* of layer i, so each id is one less than above.

`spec.yaml`:

```yaml
speculative_config:
  decoding_type: Eagle3
  max_draft_len: {k}
  speculative_model: {draft}
  eagle3_layers_to_capture: {json.dumps([i - 1 for i in layer_ids])}
```

{trtllm_serve(verifier)}""")
    vocab = (f"a reduced draft vocabulary of {served['draft_vocab_size']} tokens (`d2t` maps them to verifier ids)"
             if int(served["draft_vocab_size"]) != int(served["vocab_size"]) else "the verifier's full vocabulary")
    markdown = f"""# Serving the EAGLE-3 head

Draft model: `{draft}` (EAGLE-3 layout: `architectures: ["{ARCHITECTURE}"]`, `fc` + `midlayer` +
`norm` + `lm_head`; the embedding is the verifier's). It predicts over {vocab}.
Target (verifier): `{verifier}`. Draft tokens per step k = {k} (`train.eagle3.draft_tokens`, as trained);
verifier layers feeding the head {layer_ids} (`eagle_aux_hidden_state_layer_ids`: id L is the
input of layer L, counted from 0).

{vllm_section(verifier, speculative)}
{sglang}
{trtllm}"""
    return Launch(markdown, speculative, "draft-eagle3")
