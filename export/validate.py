"""Check a serving layout against what its loaders read, before anyone tries to launch it.

The AR drafter is loaded by vLLM / SGLang / TensorRT-LLM as an ordinary Qwen3/Llama causal LM; the
block drafter by their DFlash loaders (`method: dflash`, `DFLASH`, `DFlashDecodingConfig`), which
read the DFlash config keys and expect the drafter's layers without embedding or LM head.
A failed check raises a DraftlineError that names the missing key.

Both layouts are also loaded the way the serving stacks load them: `config.json` through plain
transformers `AutoConfig` in a separate interpreter where draftline's classes are not registered
(the serving environment's when `make serve-env` built it), so a draftline-only model type fails here
and not in a user's `vllm serve`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from safetensors import safe_open

from pipeline.errors import DraftlineError
from pipeline.serve_env import serve_python

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
CAUSAL_LM_CONFIG_KEYS = ("architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                         "num_attention_heads", "num_key_value_heads", "vocab_size", "max_position_embeddings",
                         "rms_norm_eps")
DFLASH_CONFIG_KEYS = ("architectures", "model_type", "block_size", "num_target_layers", "dflash_config",
                      "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                      "rms_norm_eps", "num_hidden_layers", "vocab_size")
DFLASH_SUBKEYS = ("mask_token_id", "target_layer_ids")
LAYER_WEIGHTS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                 "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                 "input_layernorm.weight", "post_attention_layernorm.weight")
QWEN3_NORMS = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")
_HINT = "re-run `dvc repro export` (and the drafter's train stage if the drafter itself lacks it)"


def _fail(where: Path, what: str) -> None:
    raise DraftlineError(f"{where}: missing {what}; {_HINT}")


def read_config(directory: Path) -> dict:
    path = directory / "config.json"
    if not path.is_file():
        _fail(directory, "config.json")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise DraftlineError(f"{path} is not valid JSON ({error}); {_HINT}") from None


def weight_names(directory: Path) -> set[str]:
    """Tensor names of a safetensors checkpoint, single file or sharded with an index."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        return set(json.loads(index.read_text(encoding="utf-8"))["weight_map"])
    single = directory / "model.safetensors"
    if not single.is_file():
        _fail(directory, "model.safetensors (or model.safetensors.index.json)")
    with safe_open(str(single), framework="pt") as handle:
        return set(handle.keys())


# Runs with `python -I`: no PYTHONPATH, no cwd on sys.path, so draftline cannot be imported by accident.
_AUTOCONFIG_PROBE = """
import json, sys
from transformers import AutoConfig
try:
    config = AutoConfig.from_pretrained(sys.argv[1])
    print(json.dumps({"model_type": config.model_type, "class": type(config).__name__}))
except Exception as error:
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    print(json.dumps({"error": lines[0] if lines else type(error).__name__}))
"""
AUTOCONFIG_TIMEOUT_S = 300


def check_plain_autoconfig(directory: Path, expected_model_type: str) -> None:
    """Load `config.json` with plain transformers AutoConfig in a process without draftline."""
    python = serve_python() or Path(sys.executable)
    try:
        done = subprocess.run([str(python), "-I", "-c", _AUTOCONFIG_PROBE, str(directory)], capture_output=True,
                              text=True, timeout=AUTOCONFIG_TIMEOUT_S, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    except subprocess.TimeoutExpired:
        raise DraftlineError(f"{directory}: loading config.json with transformers AutoConfig ({python}) took over "
                             f"{AUTOCONFIG_TIMEOUT_S} s; check that environment") from None
    lines = done.stdout.strip().splitlines()
    try:
        probe = json.loads(lines[-1]) if lines else {}
    except ValueError:
        probe = {}
    if "error" in probe:
        raise DraftlineError(f"{directory}/config.json does not load with plain transformers AutoConfig, as serving "
                             f"stacks load it: {probe['error']}; {_HINT}")
    if probe.get("model_type") != expected_model_type:
        stderr = [line for line in done.stderr.strip().splitlines() if line.strip()]
        why = stderr[-1] if stderr else f"got {probe or 'no output'}"
        raise DraftlineError(f"{directory}/config.json: plain transformers AutoConfig ({python}) did not give model "
                             f"type '{expected_model_type}' ({why}); {_HINT}")


def _require_keys(where: Path, config: dict, keys: tuple[str, ...], prefix: str = "",
                  nullable: tuple[str, ...] = ()) -> None:
    for key in keys:
        if key not in config or (config[key] is None and key not in nullable):
            _fail(where, f"config key '{prefix}{key}'")


def _require_rope_theta(where: Path, config: dict) -> None:
    # transformers 5 writes rope_parameters.rope_theta, older loaders read rope_theta: either is fine
    if "rope_theta" not in config and "rope_theta" not in (config.get("rope_parameters") or {}):
        _fail(where, "config key 'rope_theta' (or 'rope_parameters.rope_theta')")


def _require_weights(where: Path, names: set[str], required: list[str]) -> None:
    for name in required:
        if name not in names:
            _fail(where, f"weight '{name}'")


def _require_tokenizer(where: Path) -> None:
    for name in TOKENIZER_FILES:
        if not (where / name).is_file():
            _fail(where, f"tokenizer file '{name}'")


def _layer_weights(prefix: str, layers: int, qk_norm: bool) -> list[str]:
    suffixes = LAYER_WEIGHTS + (QWEN3_NORMS if qk_norm else ())
    return [f"{prefix}{layer}.{suffix}" for layer in range(layers) for suffix in suffixes]


def validate_causal_lm(directory: Path) -> dict:
    """A plain HF Qwen3/Llama causal LM dir as draft-model loaders read it. Returns the config."""
    config = read_config(directory)
    _require_keys(directory, config, CAUSAL_LM_CONFIG_KEYS)
    _require_rope_theta(directory, config)
    names = weight_names(directory)
    required = ["model.embed_tokens.weight", "model.norm.weight"]
    if not config.get("tie_word_embeddings", False):
        required.append("lm_head.weight")
    required += _layer_weights("model.layers.", int(config["num_hidden_layers"]), config["model_type"] == "qwen3")
    _require_weights(directory, names, required)
    _require_tokenizer(directory)
    check_plain_autoconfig(directory, str(config["model_type"]))
    return config


def validate_dflash(directory: Path) -> dict:
    """The DFlash layout (contracts.md): DFlash keys, drafter layers + fc/hidden_norm/norm, no embedding
    or LM head (those come from the verifier). Returns the config."""
    config = read_config(directory)
    _require_keys(directory, config, DFLASH_CONFIG_KEYS)
    _require_rope_theta(directory, config)
    if config["model_type"] != "qwen3" or config.get("layer_types") != ["full_attention"] * int(
            config["num_hidden_layers"]) or config.get("use_sliding_window") is not False:
        raise DraftlineError(f"{directory}: a served DFlash config needs model_type 'qwen3', layer_types all "
                             f"'full_attention' and use_sliding_window false (got model_type "
                             f"'{config['model_type']}'); {_HINT}")
    if "DFlashDraftModel" not in config["architectures"]:
        raise DraftlineError(f"{directory}: config 'architectures' is {config['architectures']}, expected "
                             f"['DFlashDraftModel']; {_HINT}")
    dflash = config["dflash_config"]
    if not isinstance(dflash, dict):
        _fail(directory, "config key 'dflash_config' (a mapping)")
    # never null here: a learned-mask drafter is refused at export (serving.dflash_serving_config)
    _require_keys(directory, dflash, DFLASH_SUBKEYS, prefix="dflash_config.")
    # num_target_layers is the verifier's depth (what serving stacks read), so every id must fit in it
    depth, layer_ids = int(config["num_target_layers"]), list(dflash["target_layer_ids"])
    if not layer_ids or not all(0 <= int(i) < depth for i in layer_ids):
        raise DraftlineError(f"{directory}: dflash_config.target_layer_ids {layer_ids} must be non-empty ids below "
                             f"num_target_layers ({depth}); {_HINT}")
    names = weight_names(directory)
    required = ["fc.weight", "hidden_norm.weight", "norm.weight"]
    required += _layer_weights("layers.", int(config["num_hidden_layers"]), True)
    _require_weights(directory, names, required)
    stray = sorted(name for name in names if "embed_tokens" in name or name.startswith("lm_head"))
    if stray:
        raise DraftlineError(f"{directory}: DFlash drafter must not carry '{stray[0]}' (embedding and LM head "
                             f"come from the verifier); {_HINT}")
    _require_tokenizer(directory)
    check_plain_autoconfig(directory, "qwen3")
    return config
