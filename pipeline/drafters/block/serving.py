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


def served_config(config: dict) -> dict:
    """The DFlash `config.json` as serving stacks load it (see the module docstring for who reads what).

    A learned mask embedding is refused: vLLM only substitutes a separate mask embedding for a real
    vocabulary id (`mask_embedding.pt` + `dflash_config.mask_token_id`), so a drafter trained with a
    position-based learned mask would be served with the wrong embedding whenever the anchor token
    is that id, and SGLang / TensorRT-LLM would silently drop the tensor.
    """
    if config.get("mask_mode") == "learned" or config["dflash_config"].get("mask_token_id") is None:
        raise DraftlineError("block drafter was trained with a learned mask embedding (train.block.mask: learned), "
                             "which vLLM, SGLang and TensorRT-LLM cannot load; retrain with train.block.mask: auto "
                             "(a vocabulary id chosen by rule) to export it for serving")
    served = {key: value for key, value in config.items() if key not in DRAFTLINE_ONLY_KEYS}
    layers = int(config["num_hidden_layers"])
    served.update(model_type="qwen3", architectures=["DFlashDraftModel"], use_sliding_window=False,
                  sliding_window=None, max_window_layers=layers, layer_types=["full_attention"] * layers)
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
    if "DFlashDraftModel" not in config["architectures"]:
        raise DraftlineError(f"{directory}: config 'architectures' is {config['architectures']}, expected "
                             f"['DFlashDraftModel']; {HINT}")
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
    require_weights(directory, names, required)
    stray = sorted(name for name in names if "embed_tokens" in name or name.startswith("lm_head"))
    if stray:
        raise DraftlineError(f"{directory}: DFlash drafter must not carry '{stray[0]}' (embedding and LM head "
                             f"come from the verifier); {HINT}")
    require_tokenizer(directory)
    check_plain_autoconfig(directory, "qwen3")
    return config


def launch(served: dict, verifier: str, draft: Path, drafter_dir: Path) -> Launch:
    block = int(served["block_size"])
    k = block - 1
    mask_token_id = served["dflash_config"]["mask_token_id"]
    mask_rule = f" ({served['mask_rule']})" if served.get("mask_rule") else ""
    layer_ids = "[" + ", ".join(str(int(i)) for i in served["dflash_config"]["target_layer_ids"]) + "]"
    speculative = {"method": "dflash", "model": str(draft), "num_speculative_tokens": k}
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
    return Launch(markdown, speculative)
