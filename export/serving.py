"""Serving checkpoints and their launch snippets (vLLM, SGLang, TensorRT-LLM).

The AR drafter is served as a plain HF causal LM draft model; the block drafter in the DFlash
layout (`method: dflash` / `DFLASH` / `DFlashDecodingConfig`), which speculates block_size − 1
tokens per step. Snippets carry the real paths and numbers so they can be pasted as they are; the
vLLM speculative config is also written as `vllm.json`, which stage `serve_check` runs verbatim.

The DFlash `config.json` is rewritten for the serving stacks, which parse it with plain transformers
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
import shutil
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import DraftlineError

SERVING_DIR = "serving"
LAUNCH_NAME = "launch.md"
NOT_SERVED = ("training.json",)  # training records stay in the drafter artifact (lineage is in the manifest)
VLLM_NAME = "vllm.json"  # {"model": verifier, "speculative_config": {...}}: what launch.md tells vLLM users
DRAFTLINE_ONLY_KEYS = ("model_type", "mask_mode", "auto_map")  # meaningless to (or wrong for) serving loaders


def copy_checkpoint(drafter_dir: Path, serving_dir: Path) -> None:
    if not (drafter_dir / "config.json").is_file():
        raise DraftlineError(f"no drafter checkpoint at {drafter_dir}; run `dvc repro train_{drafter_dir.name}`")
    serving_dir.mkdir(parents=True, exist_ok=True)
    for item in sorted(drafter_dir.iterdir()):
        if item.name in NOT_SERVED or item.name.startswith("."):
            continue
        if item.is_dir():
            shutil.copytree(item, serving_dir / item.name)
        else:
            shutil.copy2(item, serving_dir / item.name)


def dflash_serving_config(config: dict) -> dict:
    """The DFlash `config.json` as serving stacks load it (see the module docstring for who reads what).

    A learned mask embedding is refused: vLLM only substitutes a separate mask embedding for a real
    vocabulary id (`mask_embedding.pt` + `dflash_config.mask_token_id`), so a drafter trained with a
    position-based learned mask would be served with the wrong embedding whenever the anchor token
    is that id, and SGLang / TensorRT-LLM would silently drop the tensor.
    """
    if config.get("mask_mode") == "learned" or config["dflash_config"].get("mask_token_id") is None:
        raise DraftlineError("block drafter was trained with a learned mask embedding (train.block.mask: learned), "
                             "which vLLM, SGLang and TensorRT-LLM cannot load; retrain with train.block.mask: token "
                             "(needs a <|mask|> token id in the verifier's vocabulary) to export it for serving")
    served = {key: value for key, value in config.items() if key not in DRAFTLINE_ONLY_KEYS}
    layers = int(config["num_hidden_layers"])
    served.update(model_type="qwen3", architectures=["DFlashDraftModel"], use_sliding_window=False,
                  sliding_window=None, max_window_layers=layers, layer_types=["full_attention"] * layers)
    return served


def write_dflash_serving_config(serving_dir: Path) -> dict:
    path = serving_dir / "config.json"
    config = dflash_serving_config(json.loads(path.read_text(encoding="utf-8")))
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return config


@dataclass(frozen=True)
class LaunchInfo:
    verifier: str  # what the serving stack loads as the target model
    draft: str  # absolute path of the serving checkpoint
    num_speculative_tokens: int
    block_size: int | None = None
    mask_token_id: int | None = None
    target_layer_ids: tuple[int, ...] = ()


def _yaml_list(values: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def vllm_speculative_config(kind: str, info: LaunchInfo) -> dict:
    """vLLM's `--speculative-config` for this drafter (the one launch.md shows and serve_check runs)."""
    method = "draft_model" if kind == "ar" else "dflash"
    return {"method": method, "model": info.draft, "num_speculative_tokens": info.num_speculative_tokens}


def vllm_job(kind: str, info: LaunchInfo) -> dict:
    return {"model": info.verifier, "speculative_config": vllm_speculative_config(kind, info)}


def ar_launch(info: LaunchInfo) -> str:
    k = info.num_speculative_tokens
    vllm = json.dumps(vllm_speculative_config("ar", info))
    return f"""# Serving the AR drafter

Draft model: `{info.draft}` (a plain HF causal LM with the verifier's tokenizer).
Target (verifier): `{info.verifier}`. Draft tokens per step k = {k} (`train.ar.draft_tokens`, as trained).

## vLLM

Run by stage `serve_check` with exactly this speculative config (`vllm.json`; results in
`metrics/serving.json`).

```bash
vllm serve {info.verifier} \\
  --speculative-config '{vllm}'
```

## SGLang (standalone draft model)

Checked against SGLang's loader code only, not run here.

```bash
python -m sglang.launch_server --model-path {info.verifier} \\
  --speculative-algorithm STANDALONE \\
  --speculative-draft-model-path {info.draft} \\
  --speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}
```

## TensorRT-LLM (DraftTarget)

Checked against TensorRT-LLM's config classes only, not run here.

`spec.yaml`:

```yaml
speculative_config:
  decoding_type: DraftTarget
  max_draft_len: {k}
  speculative_model: {info.draft}
```

```bash
trtllm-serve {info.verifier} --config spec.yaml   # older releases: --extra_llm_api_options spec.yaml
```
"""


def block_launch(info: LaunchInfo) -> str:
    k = info.num_speculative_tokens
    vllm = json.dumps(vllm_speculative_config("block", info))
    return f"""# Serving the block (DFlash) drafter

Draft model: `{info.draft}` (DFlash layout: `architectures: ["DFlashDraftModel"]`, drafter layers +
`fc` + `hidden_norm` + `norm`; embedding and LM head are the verifier's).
Target (verifier): `{info.verifier}`. Block size {info.block_size}, so {k} draft tokens per step;
mask token id {info.mask_token_id}; verifier layers feeding the drafter {_yaml_list(info.target_layer_ids)}.
The checkpoint ships no modelling code: use a serving build with native DFlash support.

## vLLM

Run by stage `serve_check` with exactly this speculative config (`vllm.json`; results in
`metrics/serving.json`).

```bash
vllm serve {info.verifier} \\
  --speculative-config '{vllm}'
```

## SGLang

Checked against SGLang's loader code only, not run here.

```bash
python -m sglang.launch_server --model-path {info.verifier} \\
  --speculative-algorithm DFLASH \\
  --speculative-draft-model-path {info.draft} \\
  --speculative-num-draft-tokens {info.block_size}
```

## TensorRT-LLM (DFlashDecodingConfig)

Checked against TensorRT-LLM's config classes only, not run here.

`spec.yaml`:

```yaml
speculative_config:
  decoding_type: DFlash
  max_draft_len: {k}
  speculative_model: {info.draft}
  mask_token_id: {json.dumps(info.mask_token_id)}
  target_layer_ids: {_yaml_list(info.target_layer_ids)}
```

```bash
trtllm-serve {info.verifier} --config spec.yaml   # older releases: --extra_llm_api_options spec.yaml
```
"""


def launch_info(kind: str, config: dict, verifier: str, draft: Path, ar_draft_tokens: int | None) -> LaunchInfo:
    if kind == "ar":
        if not ar_draft_tokens:
            raise DraftlineError("the AR drafter's training.json records no draft_tokens; retrain it "
                                 "(`dvc repro train_ar`)")
        return LaunchInfo(verifier, str(draft), ar_draft_tokens)
    dflash = config["dflash_config"]
    block = int(config["block_size"])
    return LaunchInfo(verifier, str(draft), block - 1, block, dflash["mask_token_id"],
                      tuple(int(i) for i in dflash["target_layer_ids"]))


def launch_markdown(kind: str, info: LaunchInfo) -> str:
    return ar_launch(info) if kind == "ar" else block_launch(info)
