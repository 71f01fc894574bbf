"""Stage `serve_check`: the exported drafters run in vLLM (the `make serve-env` environment) with output
identical to vLLM without speculation, τ from vLLM's counters next to draftline's; the pass/fail/skip
rules; promote refusing a drafter that did not pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from datasets import Dataset, DatasetDict

from pipeline.config import DRAFTER_NAMES, parse_params
from pipeline.errors import DraftlineError
from pipeline.lineage import hash_dir
from pipeline.paths import ArtifactPaths
from pipeline.promote import serve_check_refusals
from pipeline.serve_env import serve_python
from serve_eval import serve_check
from serve_eval.decoding import Generation, Step
from tests.tiny_models import save_tiny_eagle3, tiny_qwen3, tiny_tokenizer

K = 3  # AR draft tokens; the block drafter's block is K + 1

# --------------------------------------------------------------------------- rules, on recorded results


def vllm_domain(outputs, drafts=0, draft_tokens=0, accepted=0, tokens=None):
    return {"outputs": outputs, "wall_s": 1.0, "tokens": tokens or sum(map(len, outputs)),
            "counters": {serve_check.DRAFTS: drafts, serve_check.DRAFT_TOKENS: draft_tokens,
                         serve_check.ACCEPTED: accepted, serve_check.PER_POSITION: [accepted, 0, 0]}}


def generation(new_ids, steps):
    """steps: (drafted, accepted) per verifier forward."""
    return Generation([1], list(new_ids), [Step(d, a, a + 1, 0.0, 0.0) for d, a in steps])


BASELINE = {"domains": {"code": vllm_domain([[5, 6, 7, 8]])}}
JOB = {"speculative_config": {"method": "draft_model", "model": "/d", "num_speculative_tokens": K}}


def test_identical_outputs_and_agreeing_tau_pass():
    # vLLM: 2 drafting steps, 3 accepted -> tau 2.5; draftline: 2 full drafting steps, 3 accepted -> 2.5
    # (its last step, cut to 1 draft by max_new_tokens, is not counted: vLLM would have drafted K)
    result = {"error": None, "engine_start_s": 3.0, "domains": {"code": vllm_domain([[5, 6, 7, 8]], 2, 6, 3)}}
    ours = {"code": [generation([5, 6, 7, 8], [(3, 2), (3, 1), (1, 0)])]}
    entry = serve_check.check_drafter(JOB, result, BASELINE, ours, max_gap=0.15)
    assert entry["status"] == "passed" and entry["reason"] is None
    record = entry["domains"]["code"]
    assert record["outputs_identical"] and record["vllm"]["tau"] == 2.5 and record["draftline"]["tau"] == 2.5
    assert record["tau_gap"] == 0 and record["vllm"]["acceptance_rate"] == 0.5
    assert record["draftline_same_outputs"] == 1 and record["vllm"]["speedup"] == 1.0


def test_mismatch_no_drafts_and_tau_gap_fail():
    mismatch = {"error": None, "domains": {"code": vllm_domain([[5, 6, 9, 9]], 2, 6, 3)}}
    entry = serve_check.check_drafter(JOB, mismatch, BASELINE, None, max_gap=0.15)
    assert entry["status"] == "failed" and "outputs differ" in entry["reason"] and "1/1" in entry["reason"]

    silent = {"error": None, "domains": {"code": vllm_domain([[5, 6, 7, 8]])}}
    entry = serve_check.check_drafter(JOB, silent, BASELINE, None, max_gap=0.15)
    assert entry["status"] == "failed" and "proposed no drafts" in entry["reason"]

    # vLLM accepts nothing (tau 1.0) where draftline accepts everything (tau 4.0): a dropped weight looks like this
    gap = {"error": None, "domains": {"code": vllm_domain([[5, 6, 7, 8]], 3, 9, 0)}}
    ours = {"code": [generation([5, 6, 7, 8], [(3, 3)])]}
    entry = serve_check.check_drafter(JOB, gap, BASELINE, ours, max_gap=0.15)
    assert entry["status"] == "failed" and "gap 75.0%" in entry["reason"]


def test_vllm_errors_fail_or_skip_with_their_first_line():
    unsupported = {"error": "RuntimeError: Unsupported CPU attention configuration: head_dim=8", "domains": {}}
    entry = serve_check.check_drafter(JOB, unsupported, BASELINE, None, max_gap=0.15)
    assert entry["status"] == "skipped" and "head_dim=8" in entry["reason"]
    broken = {"error": "KeyError: 'fc.weight'", "domains": {}}
    assert serve_check.check_drafter(JOB, broken, BASELINE, None, 0.15)["status"] == "failed"


# --------------------------------------------------------------------------- promote


def _params(tmp_path: Path, **serve) -> object:
    return parse_params({"project": {"artifacts_dir": str(tmp_path / "artifacts"),
                                     "metrics_dir": str(tmp_path / "metrics"), "plots_dir": str(tmp_path / "plots")},
                         "serve_check": serve})


def test_promote_refuses_what_serve_check_did_not_pass(tmp_path):
    params = _params(tmp_path)
    paths = ArtifactPaths.from_params(params)
    with pytest.raises(DraftlineError, match="dvc repro serve_check"):
        serve_check_refusals(params, paths, ["ar", "block"])
    paths.metrics.mkdir()
    (paths.metrics / "serving.json").write_text(json.dumps({"drafters": {
        "ar": {"status": "passed", "reason": None},
        "block": {"status": "skipped", "reason": "Unsupported CPU attention configuration"}}}))
    refusals = serve_check_refusals(params, paths, ["ar", "block"])
    assert list(refusals) == ["block"] and "serve_check skipped: Unsupported CPU attention" in refusals["block"]
    assert serve_check_refusals(_params(tmp_path, required=False), paths, ["ar", "block"]) == {}


# --------------------------------------------------------------------------- the stage


TEXTS = {"code": ["def add(a, b):\n    return a + b\n", "import os\nimport sys\nfor i in range(10):\n"],
         "text": ["The quick brown fox jumps over the lazy dog.", "Speculative decoding drafts tokens with"]}


def prompt_ids(tokenizer) -> list[list[int]]:
    return [tokenizer(text)["input_ids"][:12] for domain_texts in TEXTS.values() for text in domain_texts]


def write_corpus(tokenizer, directory: Path) -> None:
    rows = [{"id": f"{domain}{index}", "domain": domain, "source": "test", "prompt": text,
             "prompt_ids": tokenizer(text)["input_ids"][:12], "response_ids": [], "finish_reason": "length",
             "temperature": 0.0, "seed": 0}
            for domain, domain_texts in TEXTS.items() for index, text in enumerate(domain_texts)]
    split = Dataset.from_list(rows)
    DatasetDict({"train": split, "validation": split, "test": split}).save_to_disk(str(directory))


def write_params(work: Path, **serve) -> Path:
    path = work / "params.yaml"
    path.write_text(yaml.safe_dump({
        "project": {"artifacts_dir": str(work / "artifacts"), "metrics_dir": str(work / "metrics"),
                    "plots_dir": str(work / "plots")},
        "serve_check": {"prompts_per_domain": 2, "max_new_tokens": 16, **serve}}))
    return path


def test_stage_without_serving_env_records_skipped(tmp_path, monkeypatch):
    """No `.venv-serve`: every drafter is skipped with the command that fixes it; the stage still succeeds."""
    tokenizer = tiny_tokenizer()
    paths = ArtifactPaths.from_params(parse_params(yaml.safe_load(write_params(tmp_path).read_text())))
    write_corpus(tokenizer, paths.corpus)
    for kind in DRAFTER_NAMES:
        paths.export(kind).mkdir(parents=True)
        (paths.export(kind) / "vllm.json").write_text(json.dumps({"model": "/v", "speculative_config": {}}))
    monkeypatch.setenv("DRAFTLINE_SERVE_PYTHON", str(tmp_path / "missing" / "python"))
    assert serve_check.main(["--params", str(tmp_path / "params.yaml")]) == 0
    report = json.loads((paths.metrics / "serving.json").read_text())
    assert {e["status"] for e in report["drafters"].values()} == {"skipped"}
    assert "make serve-env" in report["drafters"]["block"]["reason"]
    assert (paths.plots / "serving_tau.png").is_file() and (paths.root / "serve_check").is_dir()
    assert (paths.plots / "serving_tau.csv").read_text() == "drafter,domain,draftline_tau,vllm_tau\n"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Tiny artifacts with head_dim 32 (vLLM's CPU attention rejects 8), exported by the export stage's own
    serving code, then `serve_check` run for real: three vLLM engines (no speculation, AR, block)."""
    from export.stage import export_serving
    from pipeline.drafters.block.model import DFlashConfig, DFlashDraftModel
    from pipeline.drafters.registry import KINDS

    work = tmp_path_factory.mktemp("serve_check")
    paths = ArtifactPaths.from_params(parse_params(yaml.safe_load(write_params(work).read_text())))
    tokenizer = tiny_tokenizer()
    verifier = tiny_qwen3(len(tokenizer), hidden_size=128, num_layers=4, eos_token_id=tokenizer.eos_token_id,
                          pad_token_id=tokenizer.pad_token_id)
    verifier.save_pretrained(paths.verifier)
    tokenizer.save_pretrained(paths.verifier)
    (paths.verifier / "verifier.json").write_text(json.dumps(
        {"source": "bootstrap", "name_or_path": str(paths.verifier), "hash": hash_dir(paths.verifier), "id": "tiny"}))
    write_corpus(tokenizer, paths.corpus)
    # AR drafter = the verifier's first 2 layers: it agrees often but not always, so tau is neither 1 nor K + 1
    drafter = tiny_qwen3(len(tokenizer), hidden_size=128, num_layers=2, seed=1, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    drafter.load_state_dict(verifier.state_dict(), strict=False)
    drafter.save_pretrained(paths.drafter("ar"))
    tokenizer.save_pretrained(paths.drafter("ar"))
    (paths.drafter("ar") / "training.json").write_text(json.dumps({"kind": "ar", "draft_tokens": K}))
    torch.manual_seed(2)
    block = DFlashConfig(hidden_size=128, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=32, intermediate_size=256, vocab_size=len(tokenizer), block_size=K + 1,
                         num_target_layers=4, dflash_config={"mask_token_id": tokenizer.mask_token_id,
                                                             "target_layer_ids": [0, 2]})
    DFlashDraftModel(block).save_pretrained(paths.drafter("block"))
    tokenizer.save_pretrained(paths.drafter("block"))
    # EAGLE-3 head fitted to these prompts, over a reduced draft vocabulary (vLLM then loads d2t)
    save_tiny_eagle3(verifier, tokenizer, paths.drafter("eagle3"), draft_tokens=K, draft_vocab_size=200,
                     fit_prompts=prompt_ids(tokenizer), fit_steps=40)
    for name, kind in KINDS.items():
        export_serving(kind, paths.drafter(name), paths.export(name), paths.export(name),
                       str(paths.verifier.resolve()), tokenizer)
    assert serve_check.main(["--params", str(work / "params.yaml")]) == 0
    return paths, json.loads((paths.metrics / "serving.json").read_text())


needs_vllm = pytest.mark.skipif(serve_python() is None,
                                reason="no serving environment: run `make serve-env` (vLLM without draftline)")


@pytest.mark.slow
@needs_vllm
def test_exported_drafters_load_in_vllm_with_identical_output(served):
    paths, report = served
    for kind, method in (("ar", "draft_model"), ("block", "dflash"), ("eagle3", "eagle3")):
        entry = report["drafters"][kind]
        assert entry["status"] == "passed", entry["reason"]
        assert entry["speculative_config"]["method"] == method
        assert entry["speculative_config"]["num_speculative_tokens"] == K
        for record in entry["domains"].values():
            assert record["outputs_identical"] and record["prompts"] == 2
            assert record["vllm"]["num_drafts"] > 0 and record["vllm"]["num_draft_tokens"] == K * record["vllm"][
                "num_drafts"]
    assert set(report["drafters"]["ar"]["domains"]) == {"code", "text"}
    assert (paths.root / "serve_check" / "block.log").is_file()


@pytest.mark.slow
@needs_vllm
def test_vllm_tau_matches_draftline_tau(served):
    paths, report = served
    for kind in ("ar", "block", "eagle3"):
        for record in report["drafters"][kind]["domains"].values():
            assert 1.0 <= record["vllm"]["tau"] <= K + 1 and record["tau_gap"] <= 0.15
            assert record["draftline_same_outputs"] == 2  # vLLM's greedy output equals draftline's here
    assert any(1.0 < r["vllm"]["tau"] < K + 1 for r in report["drafters"]["ar"]["domains"].values())
    assert all(r["vllm"]["tau"] > 1.5 for r in report["drafters"]["eagle3"]["domains"].values())  # the fitted head
    rows = (paths.plots / "serving_tau.csv").read_text().splitlines()
    assert rows[0] == "drafter,domain,draftline_tau,vllm_tau" and len(rows) == 7
