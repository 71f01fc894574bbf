"""`dvc repro` end to end on a verifier draftline did not make: a Llama-style checkpoint with a full
vocabulary (no mask, pad, unk or reserved id to spare), a tokenizer that adds BOS, an end-of-turn id
in its generation_config next to EOS, five layers, and one prompt domain of the user's own naming.
Only `verifier.*` and `corpus.sources` differ from the shipped params.yaml, apart from sizes that
keep the run to a few minutes and a gate a random verifier can pass; dvc.yaml is regenerated from them
(`python -m pipeline.dvc_pipeline`), as for any params.yaml that names files the stages read."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from pipeline.serving_venv import serve_python
from tests.support.tiny_models import tiny_llama, tiny_llama_tokenizer

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

SPEED = {  # sizes only: nothing here is needed for the pipeline to work on this verifier
    "corpus": {"max_new_tokens": 24, "batch_size": 8},
    "train": {"ar": {"trainer": {"max_steps": 20, "val_every_n_steps": 10, "checkpoint_every_n_steps": 10,
                                 "batch_size": 8}},
              **{kind: {"block_size": 4, "num_layers": 1, "decode_prompts": 1,
                        "trainer": {"epochs": 2, "val_every_n_steps": 20, "checkpoint_every_n_steps": 20}}
                 for kind in ("block", "dspark")}},
    "export": {"parity_steps": 3, "parity_prompts": 1},
    "evaluate": {"prompts_per_domain": 3, "max_new_tokens": 16, "temperatures": [0.0], "peer_baseline": False},
    "serve_check": {"prompts_per_domain": 2, "max_new_tokens": 16},
    # a random verifier's drafters draft little and gain no speed on a CPU: the gate only has to be decidable
    "promote": {"default_gate": {"min_tau": 1.0, "min_speedup": 0.0}},
}


def merge(base: dict, update: dict) -> dict:
    for key, value in update.items():
        base[key] = merge(base.get(key) or {}, value) if isinstance(value, dict) else value
    return base


def copy_project(target: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.split()
    for name in files:
        if (REPO / name).is_file() and not name.startswith("tests/"):
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, target / name)
    subprocess.run(["git", "init", "-q"], cwd=target, check=True)


@pytest.mark.slow
@pytest.mark.skipif(serve_python() is None, reason="no serving environment: run `make serve-env`")
def test_dvc_repro_runs_unmodified_on_a_llama_style_verifier(tmp_path):
    verifier_dir = tmp_path / "llama"
    tokenizer = tiny_llama_tokenizer()
    verifier = tiny_llama(tokenizer, hidden_size=128, num_layers=5)  # head_dim 32: vLLM's CPU attention runs it
    with torch.no_grad():  # a random model's argmax is much the same id everywhere: keep it off bos/eos/eot
        verifier.lm_head.weight[:3] = 0.0
    verifier.save_pretrained(verifier_dir)
    tokenizer.save_pretrained(verifier_dir)
    prompts = tmp_path / "stories.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Story {i}: the quick brown fox jumps over the lazy dog"
                                                     f" {i} times, then"}) + "\n" for i in range(80)))

    project = tmp_path / "project"
    copy_project(project)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["verifier"].update(source="hf", name_or_path=str(verifier_dir))
    params["corpus"]["sources"] = [{"kind": "file", "path": str(prompts), "domain": "stories"}]
    (project / "params.yaml").write_text(yaml.safe_dump(merge(params, SPEED)))

    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "PYTHONPATH": str(project), "HF_HUB_OFFLINE": "1",
           "DRAFTLINE_SERVE_PYTHON": str(serve_python())}
    env.pop("MLFLOW_TRACKING_URI", None)  # the project's own sqlite registry
    subprocess.run([str(BIN / "python"), "-m", "pipeline.dvc_pipeline"], cwd=project, env=env, check=True)
    dvc_yaml = (project / "dvc.yaml").read_text()
    assert str(prompts) in dvc_yaml and str(verifier_dir) in dvc_yaml  # the inputs params.yaml names are deps
    run = subprocess.run([str(BIN / "dvc"), "repro"], cwd=project, env=env, capture_output=True, text=True,
                         timeout=1500)
    log = " ".join((run.stdout + run.stderr).split())  # rich wraps long lines at the pipe's width
    assert run.returncode == 0, log[-4000:]

    import datasets

    corpus = datasets.load_from_disk(str(project / "artifacts/corpus"))
    assert set(corpus["train"]["domain"]) == {"stories"}
    assert all(ids[0] == tokenizer.bos_token_id for ids in corpus["train"]["prompt_ids"])  # served with BOS

    block = json.loads((project / "artifacts/drafters/block/config.json").read_text())
    assert block["mask_mode"] == "token" and block["mask_rule"].startswith("the rarest id in the training corpus")
    assert block["dflash_config"]["mask_token_id"] not in (0, 1, 2)  # never bos, eos or the end-of-turn id
    assert "verifier layers feeding the block drafter: [1, 2] of 5 (num_feature_layers 5 collapsed" in log
    launch = (project / "artifacts/export/block/launch.md").read_text()
    assert f"mask token id {block['dflash_config']['mask_token_id']} (the rarest id" in launch

    serving = json.loads((project / "metrics/serving.json").read_text())
    for kind in ("ar", "block"):
        assert serving["drafters"][kind]["status"] == "passed", serving["drafters"][kind]["reason"]
    promotion = json.loads((project / "metrics/promotion.json").read_text())
    for kind in ("ar", "block"):
        record = promotion["drafters"][kind]
        assert record["promoted"], record["reasons"]
        assert {c["metric"] for c in record["comparisons"]} >= {"T0.0/stories/tau", "T0.0/stories/speedup"}
