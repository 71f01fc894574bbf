"""The block drafter as serving stacks load it: the DFlash layout (vLLM `method: dflash`, SGLang
`DFLASH`, TensorRT-LLM `DFlashDecodingConfig`), block_size − 1 drafts per step.

The `config.json` is rewritten for the serving stacks, which parse it with plain transformers
`AutoConfig` (draftline's own `dflash` model type does not exist there). Which loader reads which key,
from vLLM 0.32's source (`model_executor/models/qwen3_dflash.py`, `v1/spec_decode/dflash.py`,
`v1/spec_decode/llm_base_proposer.py`, `.../eagle/eagle3_utils.py`), SGLang's
`speculative/dflash_utils.py` and z-lab/dflash's published configs:
- `model_type: qwen3`: AutoConfig builds a Qwen3Config (vLLM, SGLang, z-lab configs).
- `architectures: ["DFlashDraftModel"]`: vLLM's model registry maps it to DFlashQwen3ForCausalLM.
- `layer_types` all `full_attention`: vLLM resolves per layer causal vs non-causal and sliding
  windows from it (a `sliding_attention` layer would be causal); SGLang reads it for sliding windows.
- `use_sliding_window: false`: otherwise Qwen3Config derives `sliding_attention` layer types.
- `dflash_config.target_layer_ids`: vLLM (+1 into its aux hidden-state layer ids), SGLang.
- `dflash_config.mask_token_id`: vLLM (the token fed to the masked query slots), SGLang.
- `block_size` (top level and in `dflash_config`), `num_target_layers`: SGLang, z-lab; vLLM takes
  the block from `num_speculative_tokens`.
- `hidden_size`, `head_dim`, heads, `intermediate_size`, `rms_norm_eps`, `rope_parameters` /
  `rope_theta`, `max_position_embeddings`, `num_hidden_layers`, `vocab_size`: the layer shapes (all).
TensorRT-LLM takes mask id and layer ids from its `DFlashDecodingConfig` (the spec.yaml in launch.md);
that snippet is checked against its config class only, not run.

The DSpark variant (`markov_rank` > 0) is written for vLLM's `qwen3_dspark.py` (`Qwen3DSparkForCausalLM`,
speculator `v1/worker/gpu/spec_decode/dspark/`), which reuses the DFlash backbone and every key above, plus:
- `architectures: ["Qwen3DSparkModel"]`: the registry entry, and what makes `method: dspark` the default.
- `markov_rank`: the Markov head's width (`markov_head.markov_w1` V × r, `markov_head.markov_w2` V × r).
- `enable_confidence_head`, `confidence_head_with_markov`: the confidence head (`confidence_head.proj`,
  input hidden_size + markov_rank, with bias), read only by vLLM's adaptive verification.
- `draft_vocab_size`: the full vocabulary (no d2t), so the verifier's LM head is shared.
- `sample_from_anchor: false`: the DFlash 1 + N fill-in block, [anchor, mask × N] with position k
  predicting anchor + k, exactly what this drafter trained on (vLLM's default `true` is the layout
  whose anchor slot predicts the first draft); the Markov chain then starts from the anchor token.
- `markov_head_type: "vanilla"`: the bias reads only the previous token (what vLLM implements).
vLLM runs DSpark only in its model runner V2, which needs Triton: the CPU build (0.32.0) refuses it
("Model Runner V1 does not support: dspark"), so serve_check records it skipped there.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.drafters.interface import Launch
from pipeline.drafters.served_checks import (
    HINT,
    check_plain_autoconfig,
    fail,
    layer_weights,
    read_config,
    require_keys,
    require_rope_theta,
    require_tokenizer,
    require_weights,
    trtllm_serve,
    vllm_section,
    weight_names,
)
from pipeline.errors import DraftlineError

CONFIG_KEYS = ("architectures", "model_type", "block_size", "num_target_layers", "dflash_config",
               "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
               "rms_norm_eps", "num_hidden_layers", "vocab_size")
DFLASH_KEYS = ("mask_token_id", "target_layer_ids")
DRAFTLINE_ONLY_KEYS = ("model_type", "mask_mode", "auto_map")  # meaningless to (or wrong for) serving loaders
DSPARK_KEYS = ("markov_rank", "enable_confidence_head", "confidence_head_with_markov")
DFLASH_ARCHITECTURE = "DFlashDraftModel"
DSPARK_ARCHITECTURE = "Qwen3DSparkModel"


def is_dspark(config: dict) -> bool:
    return int(config.get("markov_rank") or 0) > 0


def served_config(config: dict) -> dict:
    """The DFlash `config.json` as serving stacks load it (see the module docstring for who reads what).

    A learned mask embedding is refused: vLLM only substitutes a separate mask embedding for a real
    vocabulary id (`mask_embedding.pt` + `dflash_config.mask_token_id`), so a drafter trained with a
    position-based learned mask would be served with the wrong embedding whenever the anchor token
    is that id, and SGLang / TensorRT-LLM would silently drop the tensor.
    """
    if config.get("mask_mode") == "learned" or config["dflash_config"].get("mask_token_id") is None:
        raise DraftlineError("the drafter was trained with a learned mask embedding (its train section's mask: "
                             "learned), which vLLM, SGLang and TensorRT-LLM cannot load; retrain with mask: auto "
                             "(a vocabulary id chosen by rule) to export it for serving")
    dspark = is_dspark(config)
    # a plain DFlash export carries no DSpark keys, so it reads exactly as before the variant existed
    dropped = DRAFTLINE_ONLY_KEYS + (() if dspark else DSPARK_KEYS)
    served = {key: value for key, value in config.items() if key not in dropped}
    layers = int(config["num_hidden_layers"])
    served.update(model_type="qwen3", architectures=[DSPARK_ARCHITECTURE if dspark else DFLASH_ARCHITECTURE],
                  use_sliding_window=False, sliding_window=None, max_window_layers=layers,
                  layer_types=["full_attention"] * layers)
    if dspark:
        served.update(markov_head_type="vanilla", sample_from_anchor=False, draft_vocab_size=config["vocab_size"])
    return served


def write_served_config(serving_dir: Path) -> None:
    path = serving_dir / "config.json"
    config = served_config(json.loads(path.read_text(encoding="utf-8")))
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def serving_layout(serving_dir: Path) -> dict:
    """Rewrite the copied checkpoint's config.json for the serving stacks, then check the layout."""
    write_served_config(serving_dir)
    return check_layout(serving_dir)


def check_layout(directory: Path) -> dict:
    """DFlash keys, drafter layers + fc/hidden_norm/norm, no embedding or LM head (those come from the
    verifier). Returns the config."""
    config = read_config(directory)
    require_keys(directory, config, CONFIG_KEYS)
    require_rope_theta(directory, config)
    if config["model_type"] != "qwen3" or config.get("layer_types") != ["full_attention"] * int(
            config["num_hidden_layers"]) or config.get("use_sliding_window") is not False:
        raise DraftlineError(f"{directory}: a served DFlash config needs model_type 'qwen3', layer_types all "
                             f"'full_attention' and use_sliding_window false (got model_type "
                             f"'{config['model_type']}'); {HINT}")
    dspark = is_dspark(config)
    expected = DSPARK_ARCHITECTURE if dspark else DFLASH_ARCHITECTURE
    if expected not in config["architectures"]:
        raise DraftlineError(f"{directory}: config 'architectures' is {config['architectures']}, expected "
                             f"['{expected}'] (markov_rank {config.get('markov_rank') or 0}); {HINT}")
    dflash = config["dflash_config"]
    if not isinstance(dflash, dict):
        fail(directory, "config key 'dflash_config' (a mapping)")
    # never null here: a learned-mask drafter is refused by served_config
    require_keys(directory, dflash, DFLASH_KEYS, prefix="dflash_config.")
    # num_target_layers is the verifier's depth (what serving stacks read), so every id must fit in it
    depth, layer_ids = int(config["num_target_layers"]), list(dflash["target_layer_ids"])
    if not layer_ids or not all(0 <= int(i) < depth for i in layer_ids):
        raise DraftlineError(f"{directory}: dflash_config.target_layer_ids {layer_ids} must be non-empty ids below "
                             f"num_target_layers ({depth}); {HINT}")
    names = weight_names(directory)
    required = ["fc.weight", "hidden_norm.weight", "norm.weight"]
    required += layer_weights("layers.", int(config["num_hidden_layers"]), True)
    if dspark:
        required += dspark_weights(directory, config)
    require_weights(directory, names, required)
    stray = sorted(name for name in names if "embed_tokens" in name or name.startswith("lm_head"))
    if stray:
        raise DraftlineError(f"{directory}: DFlash drafter must not carry '{stray[0]}' (embedding and LM head "
                             f"come from the verifier); {HINT}")
    require_tokenizer(directory)
    check_plain_autoconfig(directory, "qwen3")
    return config


def dspark_weights(directory: Path, config: dict) -> list[str]:
    """The DSpark heads' weight names vLLM loads, after checking the keys that size them."""
    require_keys(directory, config, DSPARK_KEYS + ("draft_vocab_size",))
    if config.get("sample_from_anchor") is not False:
        raise DraftlineError(f"{directory}: a served DSpark config needs sample_from_anchor false (this drafter "
                             f"predicts anchor + k at block position k, DFlash's fill-in layout); {HINT}")
    names = ["markov_head.markov_w1.weight", "markov_head.markov_w2.weight"]
    if config["enable_confidence_head"]:
        names += ["confidence_head.proj.weight", "confidence_head.proj.bias"]
    return names


def launch(served: dict, verifier: str, draft: Path, drafter_dir: Path) -> Launch:
    if is_dspark(served):
        return dspark_launch(served, verifier, draft)
    block = int(served["block_size"])
    k = block - 1
    mask_token_id = served["dflash_config"]["mask_token_id"]
    mask_rule = f" ({served['mask_rule']})" if served.get("mask_rule") else ""
    layer_ids = "[" + ", ".join(str(int(i)) for i in served["dflash_config"]["target_layer_ids"]) + "]"
    speculative = {"method": "dflash", "model": str(draft), "num_speculative_tokens": k,
                   "draft_sample_method": "probabilistic"}
    markdown = f"""# Serving the block (DFlash) drafter

Draft model: `{draft}` (DFlash layout: `architectures: ["DFlashDraftModel"]`, drafter layers +
`fc` + `hidden_norm` + `norm`; embedding and LM head are the verifier's).
Target (verifier): `{verifier}`. Block size {block}, so {k} draft tokens per step;
mask token id {mask_token_id}{mask_rule}; verifier layers feeding the drafter {layer_ids}.
The checkpoint ships no modelling code: use a serving build with native DFlash support.

{vllm_section(verifier, speculative)}
## SGLang

Checked against SGLang's loader code only, not run here.

```bash
python -m sglang.launch_server --model-path {verifier} \\
  --speculative-algorithm DFLASH \\
  --speculative-draft-model-path {draft} \\
  --speculative-num-draft-tokens {block}
```

## TensorRT-LLM (DFlashDecodingConfig)

Checked against TensorRT-LLM's config classes only, not run here.

`spec.yaml`:

```yaml
speculative_config:
  decoding_type: DFlash
  max_draft_len: {k}
  speculative_model: {draft}
  mask_token_id: {json.dumps(mask_token_id)}
  target_layer_ids: {layer_ids}
```

{trtllm_serve(verifier)}"""
    return Launch(markdown, speculative, "draft-dflash")


def dspark_launch(served: dict, verifier: str, draft: Path) -> Launch:
    block = int(served["block_size"])
    k = block - 1
    mask_token_id = served["dflash_config"]["mask_token_id"]
    layer_ids = "[" + ", ".join(str(int(i)) for i in served["dflash_config"]["target_layer_ids"]) + "]"
    confidence = "with a confidence head" if served["enable_confidence_head"] else "without a confidence head"
    speculative = {"method": "dspark", "model": str(draft), "num_speculative_tokens": k,
                   "draft_sample_method": "probabilistic"}
    markdown = f"""# Serving the block drafter, DSpark variant (Markov head)

Draft model: `{draft}` (vLLM's DSpark layout: `architectures: ["Qwen3DSparkModel"]`, the DFlash drafter
layers + `fc` + `hidden_norm` + `norm`, plus the Markov head `markov_head.markov_w1` / `markov_w2`
(rank {served["markov_rank"]}), {confidence}; embedding and LM head are the verifier's).
Target (verifier): `{verifier}`. Block size {block}, so {k} draft tokens per step, drafted left to right
through the Markov head; mask token id {mask_token_id}; verifier layers feeding the drafter {layer_ids}.
`sample_from_anchor: false`: the block is [anchor, mask × {k}] as in DFlash.

{vllm_section(verifier, speculative)}
vLLM runs `method: dspark` only in its model runner V2, which needs Triton: on vLLM's CPU build (0.32.0)
the engine refuses it ("Model Runner V1 does not support: dspark speculative decoding"), so serve_check
records this drafter as skipped there. With a GPU build, add `"enable_adaptive_verification": true` to
let the confidence head shorten verification.

## SGLang, TensorRT-LLM

No launch snippet: this project has not checked a DSpark loader in either. Their DFlash loaders
(`DFLASH`, `DFlashDecodingConfig`) would load the backbone and drop the Markov head: lossless, but
drafting as plain DFlash. The plain block drafter's export (`method: dflash`) is the one they load.
"""
    return Launch(markdown, speculative, "draft-dspark")
