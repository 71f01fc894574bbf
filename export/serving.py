"""Serving checkpoints and their launch snippets (vLLM, SGLang, TensorRT-LLM).

The AR drafter is served as a plain HF causal LM draft model; the block drafter in the DFlash
layout (`method: dflash` / `DFLASH` / `DFlashDecodingConfig`), which speculates block_size − 1
tokens per step. Snippets carry the real paths and numbers so they can be pasted as they are.
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


def ar_launch(info: LaunchInfo) -> str:
    k = info.num_speculative_tokens
    vllm = json.dumps({"method": "draft_model", "model": info.draft, "num_speculative_tokens": k})
    return f"""# Serving the AR drafter

Draft model: `{info.draft}` (a plain HF causal LM with the verifier's tokenizer).
Target (verifier): `{info.verifier}`. Draft tokens per step k = {k} (`evaluate.ar_draft_tokens`).

## vLLM

```bash
vllm serve {info.verifier} \\
  --speculative-config '{vllm}'
```

## SGLang (standalone draft model)

```bash
python -m sglang.launch_server --model-path {info.verifier} \\
  --speculative-algorithm STANDALONE \\
  --speculative-draft-model-path {info.draft} \\
  --speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}
```

## TensorRT-LLM (DraftTarget)

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
    vllm = json.dumps({"method": "dflash", "model": info.draft, "num_speculative_tokens": k})
    return f"""# Serving the block (DFlash) drafter

Draft model: `{info.draft}` (DFlash layout: `architectures: ["DFlashDraftModel"]`, drafter layers +
`fc` + `hidden_norm` + `norm`; embedding and LM head are the verifier's).
Target (verifier): `{info.verifier}`. Block size {info.block_size}, so {k} draft tokens per step;
mask token id {info.mask_token_id}; verifier layers feeding the drafter {_yaml_list(info.target_layer_ids)}.
The checkpoint ships no modelling code: use a serving build with native DFlash support.

## vLLM

```bash
vllm serve {info.verifier} \\
  --speculative-config '{vllm}'
```

## SGLang

```bash
python -m sglang.launch_server --model-path {info.verifier} \\
  --speculative-algorithm DFLASH \\
  --speculative-draft-model-path {info.draft} \\
  --speculative-num-draft-tokens {info.block_size}
```

## TensorRT-LLM (DFlashDecodingConfig)

`spec.yaml`:

```yaml
speculative_config:
  decoding_type: DFlash
  max_draft_len: {k}
  speculative_model: {info.draft}
  mask_token_id: {info.mask_token_id}
  target_layer_ids: {_yaml_list(info.target_layer_ids)}
```

```bash
trtllm-serve {info.verifier} --config spec.yaml   # older releases: --extra_llm_api_options spec.yaml
```
"""


def launch_info(kind: str, config: dict, verifier: str, draft: Path, ar_draft_tokens: int) -> LaunchInfo:
    if kind == "ar":
        return LaunchInfo(verifier, str(draft), ar_draft_tokens)
    dflash = config["dflash_config"]
    block = int(config["block_size"])
    return LaunchInfo(verifier, str(draft), block - 1, block, dflash["mask_token_id"],
                      tuple(int(i) for i in dflash["target_layer_ids"]))


def launch_markdown(kind: str, info: LaunchInfo) -> str:
    return ar_launch(info) if kind == "ar" else block_launch(info)
