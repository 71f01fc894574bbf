"""Stage `serve_check`: the exported drafters run in vLLM (the `make serve-env` environment) with output
identical to vLLM without speculation, τ from vLLM's counters next to draftline's; the pass/fail/skip
rules; promote refusing a drafter that did not pass."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from datasets import Dataset, DatasetDict

from export.manifest import file_table
from pipeline.config.base import DRAFTER_NAMES
from pipeline.config.schema import parse_all
from pipeline.config.serve_check_config import ServeCheckConfig
from pipeline.drafters.speculative_loop import Generation, Step
from pipeline.errors import DraftlineError
from pipeline.paths import ArtifactPaths
from pipeline.promote.promote import read_serving, serve_check_refusals, served_tau, served_tau_tags
from pipeline.serving_venv import serve_python
from pipeline.verifier_record import write_record
from serve_eval import serve_check
from tests.support.tiny_models import save_tiny_eagle3, tiny_qwen3, tiny_tokenizer

K = 3  # AR draft tokens; the block drafter's block is K + 1

# --------------------------------------------------------------------------- rules, on recorded results


def vllm_domain(outputs, drafts=0, draft_tokens=0, accepted=0, tokens=None, per_pos=None):
    return {"outputs": outputs, "wall_s": 1.0, "tokens": tokens or sum(map(len, outputs)),
            "counters": {serve_check.DRAFTS: drafts, serve_check.DRAFT_TOKENS: draft_tokens,
                         serve_check.ACCEPTED: accepted,
                         serve_check.PER_POSITION: per_pos if per_pos is not None else [accepted, 0, 0]}}


def generation(new_ids, steps):
    """steps: (drafted, accepted) per verifier forward."""
    return Generation([1], list(new_ids), [Step(d, a, a + 1, 0.0, 0.0) for d, a in steps])


def greedy_runs(single, batched=None):
    return {"single": {"code": single}, "batched": {"code": batched or single}}


CONFIG = ServeCheckConfig()
BASELINE = {"runs": greedy_runs(vllm_domain([[5, 6, 7, 8]]))}
RUNS = [{"name": "single", "concurrency": 1}, {"name": "batched", "concurrency": 8}]
JOB = {"speculative_config": {"method": "draft_model", "model": "/d", "num_speculative_tokens": K}, "runs": RUNS}
AGREEING = vllm_domain([[5, 6, 7, 8]], 2, 6, 3, per_pos=[2, 1, 0])  # steps accepting 2 and 1: tau 2.5
OURS = {"greedy": {"code": [generation([5, 6, 7, 8], [(3, 2), (3, 1), (1, 0)])]}}


def test_identical_outputs_and_agreeing_tau_pass():
    # vLLM: 2 drafting steps, 3 accepted -> tau 2.5; draftline: 2 full drafting steps, 3 accepted -> 2.5
    # (its last step, cut to 1 draft by max_new_tokens, is not counted: vLLM would have drafted K)
    result = {"error": None, "engine_start_s": 3.0, "runs": greedy_runs(AGREEING)}
    entry = serve_check.check_drafter(JOB, result, BASELINE, OURS, CONFIG)
    assert entry["status"] == "passed" and entry["reason"] is None
    record = entry["domains"]["code"]
    for name, concurrency in (("single", 1), ("batched", 8)):
        run = record[name]
        assert run["outputs_identical"] and run["vllm"]["tau"] == 2.5 and run["concurrency"] == concurrency
        assert run["vllm"]["acceptance_rate"] == 0.5 and run["vllm"]["speedup"] == 1.0
    assert record["draftline"]["tau"] == 2.5 and record["draftline"]["accepted_histogram"] == [0, 1, 1, 0]
    assert record["tau_gap"] == record["single_tau_gap"] == record["batch_tau_gap"] == 0
    assert record["draftline_same_outputs"] == 1


def test_mismatch_no_drafts_and_tau_gap_fail():
    mismatch = {"error": None, "runs": greedy_runs(AGREEING, vllm_domain([[5, 6, 9, 9]], 2, 6, 3))}
    entry = serve_check.check_drafter(JOB, mismatch, BASELINE, None, CONFIG)
    assert entry["status"] == "failed" and "outputs differ" in entry["reason"] and "1/1" in entry["reason"]
    assert "concurrency 8" in entry["reason"]

    silent = {"error": None, "runs": greedy_runs(vllm_domain([[5, 6, 7, 8]]))}
    entry = serve_check.check_drafter(JOB, silent, BASELINE, None, CONFIG)
    assert entry["status"] == "failed" and "proposed no drafts" in entry["reason"]

    # vLLM accepts nothing (tau 1.0) where draftline accepts everything (tau 4.0): a dropped weight looks like this
    gap = {"error": None, "runs": greedy_runs(vllm_domain([[5, 6, 7, 8]], 3, 9, 0))}
    ours = {"greedy": {"code": [generation([5, 6, 7, 8], [(3, 3)])]}}
    entry = serve_check.check_drafter(JOB, gap, BASELINE, ours, CONFIG)
    assert entry["status"] == "failed" and "gap 75.0%" in entry["reason"]


def test_batched_tau_below_single_request_tau_fails():
    """A drafter that only works alone: same outputs, same tau as draftline one request at a time, but
    it accepts less once requests share the engine's batches."""
    batched = vllm_domain([[5, 6, 7, 8]], 4, 12, 4, per_pos=[3, 1, 0])  # tau 2.0 vs 2.5 alone
    result = {"error": None, "runs": greedy_runs(AGREEING, batched)}
    entry = serve_check.check_drafter(JOB, result, BASELINE, OURS, CONFIG)
    assert entry["status"] == "failed"
    assert "batched tau 2.000 (concurrency 8) vs single-request tau 2.500: gap 20.0% > " \
           "serve_check.max_batch_tau_gap 5%" in entry["reason"]
    assert entry["domains"]["code"]["batch_tau_gap"] == pytest.approx(0.2)
    loose = ServeCheckConfig(max_batch_tau_gap=0.25, max_tau_gap=0.25)
    assert serve_check.check_drafter(JOB, result, BASELINE, OURS, loose)["status"] == "passed"


def test_accepted_histogram_and_tau_standard_error():
    # 4 steps: accepted at least 1: 3 steps, at least 2: 1, at least 3: 0 -> exactly 0, 1, 2, 3: 1, 2, 1, 0
    counters = vllm_domain([[1]], 4, 12, 4, per_pos=[3, 1, 0])["counters"]
    assert serve_check.accepted_histogram(counters, K) == [1, 2, 1, 0]
    summary = serve_check.tau_summary([1, 2, 1, 0])
    assert summary["tau"] == 2.0 and summary["drafting_steps"] == 4
    assert summary["tau_se"] == pytest.approx((2 / 3 / 4) ** 0.5)  # sample variance 2/3 over 4 steps
    assert serve_check.tau_summary([0, 0, 0, 0])["tau"] is None


def test_sampled_tau_is_compared_within_standard_errors():
    runs = greedy_runs(AGREEING)
    many = [(3, a) for a in (0, 1, 2, 3) * 10]  # draftline at T=0.8: tau 2.5 over 40 steps, se ~0.18
    ours = {**OURS, "T=0.8": {"code": [generation([5] * 100, many)]}}
    job = {**JOB, "runs": RUNS + [{"name": "T=0.8", "concurrency": 8}]}
    close = vllm_domain([[1]], 40, 120, 56, per_pos=[28, 18, 10])  # tau 2.4
    far = vllm_domain([[1]], 40, 120, 8, per_pos=[8, 0, 0])  # tau 1.2
    for counters, status in ((close, "passed"), (far, "failed")):
        result = {"error": None, "runs": {**runs, "T=0.8": {"code": counters}}}
        entry = serve_check.check_drafter(job, result, BASELINE, ours, CONFIG)
        assert entry["status"] == status, entry["reason"]
        sampled = entry["domains"]["code"]["sampled"]["T=0.8"]
        assert sampled["draftline"]["tau"] == 2.5 and 0.2 < sampled["tolerance"] < 1.0
    assert "T=0.8: served tau 1.200 vs draftline tau 2.500: difference 1.300 > 3 standard errors" in entry["reason"]


def test_engines_leave_every_request_clear_of_the_drafter_skip_at_max_model_len(tmp_path):
    """vLLM skips drafting for the whole batch while one request's sequence plus k + 1 passes max_model_len,
    and a DFlash drafter then drafts the other requests from a context with holes: the engine must leave
    prompt + max_new_tokens + k (a verify step's longest sequence) + k + 1 below max_model_len."""
    params = _params(tmp_path, max_new_tokens=48)
    prompts = {"code": [[1] * 30], "text": [[1] * 51, [1] * 40]}
    job = serve_check.engine_job("/v", {"method": "dflash", "model": "/d", "num_speculative_tokens": 7}, prompts,
                                 params)
    assert job["max_model_len"] >= 51 + 48 + 7 + 7 + 1
    assert [run["name"] for run in job["runs"]] == ["single", "batched", "T=0.8"]
    assert job["runs"][1]["concurrency"] == 8 and job["runs"][2]["temperature"] == 0.8


def test_vllm_errors_fail_or_skip_with_their_first_line():
    unsupported = {"error": "RuntimeError: Unsupported CPU attention configuration: head_dim=8", "runs": {}}
    entry = serve_check.check_drafter(JOB, unsupported, BASELINE, None, CONFIG)
    assert entry["status"] == "skipped" and "head_dim=8" in entry["reason"]
    broken = {"error": "KeyError: 'fc.weight'", "runs": {}}
    assert serve_check.check_drafter(JOB, broken, BASELINE, None, CONFIG)["status"] == "failed"
    # the DSpark variant on vLLM's CPU build: only model runner V2 runs it, and V2 needs Triton
    dspark = {"error": "ValidationError: Value error, Model Runner V1 does not support: dspark speculative decoding",
              "runs": {}}
    entry = serve_check.check_drafter(JOB, dspark, BASELINE, None, CONFIG)
    assert entry["status"] == "skipped" and "dspark" in entry["reason"]


def test_the_runner_reports_the_reason_of_a_config_validation_error_not_its_header():
    from serve_eval.vllm_runner import first_line

    error = ValueError("1 validation error for VllmConfig\n  Value error, Model Runner V1 does not support: dspark")
    assert first_line(error) == "ValueError: Value error, Model Runner V1 does not support: dspark"
    assert first_line(RuntimeError("one line")) == "RuntimeError: one line"


# --------------------------------------------------------------------------- promote


def _params(tmp_path: Path, **serve) -> object:
    return parse_all({"project": {"artifacts_dir": str(tmp_path / "artifacts"),
                                     "metrics_dir": str(tmp_path / "metrics"), "plots_dir": str(tmp_path / "plots")},
                         "serve_check": serve})


def test_promote_refuses_what_serve_check_did_not_pass(tmp_path):
    params = _params(tmp_path)
    paths = ArtifactPaths.from_params(params)
    with pytest.raises(DraftlineError, match="dvc repro serve_check"):
        read_serving(params, paths)
    paths.metrics.mkdir()
    passed = _served_record(3.0, 3.0, 3.1)
    (paths.metrics / "serving.json").write_text(json.dumps({"drafters": {
        "ar": {"status": "passed", "reason": None, "domains": {"code": passed}},
        "block": {"status": "skipped", "reason": "Unsupported CPU attention configuration"}}}))
    refusals = serve_check_refusals(params, read_serving(params, paths), ["ar", "block"])
    assert list(refusals) == ["block"] and "serve_check skipped: Unsupported CPU attention" in refusals["block"]
    assert read_serving(_params(tmp_path, required=False), paths) is None
    assert serve_check_refusals(params, None, ["ar", "block"]) == {}


def _served_record(single: float | None, batched: float | None, ours: float | None, identical: bool = True,
                   sampled: dict | None = None) -> dict:
    """A drafter x domain record of serving.json as serve_check writes it."""
    def greedy(tau, concurrency):
        return {"concurrency": concurrency, "outputs_identical": identical, "mismatched_prompts": 0 if identical else 3,
                "vllm": {"tau": tau}}
    return {"single": greedy(single, 1), "batched": greedy(batched, 8), "draftline": {"tau": ours},
            "sampled": sampled or {}}


@pytest.mark.parametrize("record, expected", [
    (_served_record(3.0, 3.0, 3.0, identical=False), "outputs differ from the engine without speculation"),
    (_served_record(2.0, 2.0, 3.0), "> serve_check.max_tau_gap"),
    (_served_record(3.0, 2.5, 3.0), "> serve_check.max_batch_tau_gap"),
    (_served_record(None, 3.0, 3.0), "the engine proposed no drafts"),
    (_served_record(3.0, 3.0, None), "no draftline tau recorded"),
    (_served_record(3.0, 3.0, 3.0, sampled={"T=0.8": {"vllm": {"tau": 1.2, "tau_se": 0.05},
                                                      "draftline": {"tau": 2.5, "tau_se": 0.05}}}),
     "T=0.8: served tau 1.200 vs draftline tau 2.500"),
    (None, "measured no domain"),
])
def test_a_status_flipped_to_passed_is_rederived_from_the_numbers(tmp_path, record, expected):
    serving = {"drafters": {"ar": {"status": "passed", "reason": None,
                                   "domains": {"code": record} if record else {}}}}
    refusals = serve_check_refusals(_params(tmp_path), serving, ["ar"])
    assert expected in refusals["ar"]


def test_promote_rederives_the_launch_command_run_too(tmp_path):
    passed = _served_record(3.0, 3.0, 3.0)
    launch = {"status": "passed", "agrees_with_in_process": True, "domains": {"code": passed}}

    def refusal(launch_record):
        entry = {"status": "passed", "reason": None, "domains": {"code": passed}, "launch_command": launch_record}
        return serve_check_refusals(_params(tmp_path), {"drafters": {"ar": entry}}, ["ar"]).get("ar")

    assert refusal(launch) is None
    assert "launch.md's command says passed but code: " in refusal({**launch, "domains": {"code": _served_record(2.0, 2.0, 3.0)}})
    assert "did not pass: greedy outputs differ" in refusal({**launch, "agrees_with_in_process": False,
                                                             "disagreements": ["greedy outputs differ"]})
    assert "did not pass: vllm serve exited" in refusal({**launch, "status": "failed", "reason": "vllm serve exited"})


def test_a_sampled_gap_fails_only_when_gated(tmp_path):
    """With serve_check.gate_sampled false the T>0 gap is recorded and warned about, not a failure, in
    serve_check's rule and in promote's rederivation of it alike."""
    from pipeline.serving_rule import domain_failures, sampled_gaps

    record = _served_record(3.0, 3.0, 3.0, sampled={"T=0.8": {"vllm": {"tau": 1.02, "tau_se": 0.02},
                                                              "draftline": {"tau": 2.3, "tau_se": 0.1}}})
    assert sampled_gaps(record, 3.0) == ["T=0.8: served tau 1.020 vs draftline tau 2.300: difference 1.280 > "
                                         "3 standard errors (0.306)"]
    assert domain_failures(record, 0.15, 0.05, 3.0, gate_sampled=True) == sampled_gaps(record, 3.0)
    assert domain_failures(record, 0.15, 0.05, 3.0, gate_sampled=False) == []
    serving = {"drafters": {"ar": {"status": "passed", "reason": None, "domains": {"code": record}}}}
    assert "T=0.8" in serve_check_refusals(_params(tmp_path), serving, ["ar"])["ar"]
    assert serve_check_refusals(_params(tmp_path, gate_sampled=False), serving, ["ar"]) == {}


def test_promote_records_the_served_tau_next_to_draftlines(tmp_path):
    params = _params(tmp_path)
    paths = ArtifactPaths.from_params(params)
    assert served_tau(paths, "block") == {} and served_tau_tags(paths, "block") == {}
    paths.metrics.mkdir()
    record = {"single": {"vllm": {"tau": 3.8}}, "batched": {"vllm": {"tau": 3.0}}, "draftline": {"tau": 3.9}}
    (paths.metrics / "serving.json").write_text(json.dumps({"concurrency": 8, "drafters": {
        "block": {"status": "failed", "domains": {"text": record}}}}))
    assert served_tau(paths, "block") == {"text": {"vllm_batched": 3.0, "vllm_single": 3.8, "draftline": 3.9,
                                                   "concurrency": 8}}
    assert served_tau_tags(paths, "block") == {"serve_check.text.served_tau": "3.0",
                                               "serve_check.text.served_tau_single": "3.8",
                                               "serve_check.text.draftline_tau": "3.9"}


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
    """No `.venv-serve` and `serve_check.required: false`: every drafter is skipped with the command that fixes
    it; the stage still succeeds."""
    tokenizer = tiny_tokenizer()
    params_path = write_params(tmp_path, required=False)
    params = {**yaml.safe_load(params_path.read_text()), "verifier": {"source": "hf", "name_or_path": str(tmp_path / "v")}}
    params_path.write_text(yaml.safe_dump(params))
    paths = ArtifactPaths.from_params(parse_all(params))
    write_corpus(tokenizer, paths.corpus)
    # what serve_check hashes of an external verifier: its files (a model dir: config.json and tokenizer)
    tiny_qwen3(len(tokenizer), num_layers=1).config.save_pretrained(tmp_path / "v")
    tokenizer.save_pretrained(tmp_path / "v")
    record = write_record(paths.verifier, source="hf", name_or_path=str(tmp_path / "v"), id_prefix="v",
                          model_dir=tmp_path / "v", configured=str((tmp_path / "v").resolve()))
    for kind in DRAFTER_NAMES:
        paths.export(kind).mkdir(parents=True)
        (paths.export(kind) / "vllm.json").write_text(json.dumps({"model": "/v", "speculative_config": {}}))
        (paths.export(kind) / "manifest.json").write_text(json.dumps({"files": {}}))
    monkeypatch.delenv("DRAFTLINE_SERVE_PYTHON", raising=False)
    monkeypatch.setattr(serve_check, "serve_python", lambda: None)
    assert serve_check.main(["--params", str(tmp_path / "params.yaml")]) == 0
    report = json.loads((paths.metrics / "serving.json").read_text())
    assert {e["status"] for e in report["drafters"].values()} == {"skipped"}
    # bound to what was checked: the export's manifest and the verifier, by content
    assert report["verifier_hash"] == record["hash"]
    assert len(report["drafters"]["ar"]["export_manifest_sha256"]) == 64
    assert "make serve-env" in report["drafters"]["block"]["reason"]
    assert (paths.plots / "serving_tau.png").is_file() and (paths.root / "serve_check").is_dir()
    assert (paths.plots / "serving_tau.csv").read_text() == "drafter,domain,run,draftline_tau,vllm_tau\n"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Tiny artifacts with head_dim 32 (vLLM's CPU attention rejects 8), exported by the export stage's own
    serving code, then `serve_check` run for real: three vLLM engines (no speculation, AR, block)."""
    from export.export import export_serving
    from pipeline.drafters.block.model import DFlashConfig, DFlashDraftModel
    from pipeline.drafters.kinds import KINDS

    work = tmp_path_factory.mktemp("serve_check")
    paths = ArtifactPaths.from_params(parse_all(yaml.safe_load(write_params(work).read_text())))
    tokenizer = tiny_tokenizer()
    verifier = tiny_qwen3(len(tokenizer), hidden_size=128, num_layers=4, eos_token_id=tokenizer.eos_token_id,
                          pad_token_id=tokenizer.pad_token_id)
    verifier.save_pretrained(paths.verifier)
    tokenizer.save_pretrained(paths.verifier)
    write_record(paths.verifier, source="bootstrap", name_or_path=str(paths.verifier), id_prefix="tiny")
    write_corpus(tokenizer, paths.corpus)
    # AR drafter = the verifier's first 2 layers: it agrees often but not always, so tau is neither 1 nor K + 1
    drafter = tiny_qwen3(len(tokenizer), hidden_size=128, num_layers=2, seed=1, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    drafter.load_state_dict(verifier.state_dict(), strict=False)
    drafter.save_pretrained(paths.drafter("ar"))
    tokenizer.save_pretrained(paths.drafter("ar"))
    (paths.drafter("ar") / "training.json").write_text(json.dumps({"kind": "ar", "draft_tokens": K}))
    torch.manual_seed(2)
    block = dict(hidden_size=128, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 intermediate_size=256, vocab_size=len(tokenizer), block_size=K + 1, num_target_layers=4,
                 dflash_config={"mask_token_id": tokenizer.mask_token_id, "target_layer_ids": [0, 2]})
    # DSpark: vLLM's CPU build refuses `method: dspark`, which serve_check records as skipped
    for kind, heads in (("block", {}), ("dspark", {"markov_rank": 8, "enable_confidence_head": True})):
        DFlashDraftModel(DFlashConfig(**block, **heads)).save_pretrained(paths.drafter(kind))
        tokenizer.save_pretrained(paths.drafter(kind))
    # EAGLE-3 head fitted to these prompts, over a reduced draft vocabulary (vLLM then loads d2t)
    save_tiny_eagle3(verifier, tokenizer, paths.drafter("eagle3"), draft_tokens=K, draft_vocab_size=200,
                     fit_prompts=prompt_ids(tokenizer), fit_steps=40)
    for name, kind in KINDS.items():
        export_serving(kind, paths.drafter(name), paths.export(name), paths.export(name),
                       str(paths.verifier.resolve()), tokenizer, paths.root)
        # serve_check serves only files its manifest hashed, as the export stage writes it
        (paths.export(name) / "manifest.json").write_text(json.dumps({"files": file_table(paths.export(name))}))
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
        # T=0.8 included: the serving env's vLLM plugin fixes the CPU build's sampled speculation
        assert entry["status"] == "passed", entry["reason"]
        assert entry["speculative_config"]["method"] == method
        assert entry["speculative_config"]["num_speculative_tokens"] == K
        for record in entry["domains"].values():
            assert record["prompts"] == 2
            for name, concurrency in (("single", 1), ("batched", 8)):
                run = record[name]
                assert run["outputs_identical"] and run["concurrency"] == concurrency
                assert run["vllm"]["num_drafts"] > 0 and run["vllm"]["num_draft_tokens"] == K * run["vllm"]["num_drafts"]
    assert set(report["drafters"]["ar"]["domains"]) == {"code", "text"}
    assert (paths.root / "serve_check" / "block.log").is_file()
    dspark = report["drafters"]["dspark"]
    assert dspark["status"] == "skipped" and "does not support: dspark" in dspark["reason"], dspark


@pytest.mark.slow
@needs_vllm
def test_vllm_tau_matches_draftline_tau(served):
    paths, report = served
    for kind in ("ar", "block", "eagle3"):
        for record in report["drafters"][kind]["domains"].values():
            for name in ("single", "batched"):
                assert 1.0 <= record[name]["vllm"]["tau"] <= K + 1
            assert record["tau_gap"] <= 0.15 and record["single_tau_gap"] <= 0.15
            assert record["draftline_same_outputs"] == 2  # vLLM's greedy output equals draftline's here
            sampled = record["sampled"]["T=0.8"]
            assert sampled["vllm"]["num_drafts"] > 0 and sampled["draftline"]["drafting_steps"] > 1
            # within the noise of both sides; no noise only where neither side's acceptance varied (the tiny EAGLE-3
            # head, fitted to greedy, can accept nothing at T=0.8 on both), and then the two agree exactly
            assert 0 <= sampled["tau_diff"] <= sampled["tolerance"]
            assert sampled["tolerance"] > 0 or sampled["tau_diff"] == 0
    assert any(1.0 < r["single"]["vllm"]["tau"] < K + 1 for r in report["drafters"]["ar"]["domains"].values())
    assert all(r["single"]["vllm"]["tau"] > 1.5 for r in report["drafters"]["eagle3"]["domains"].values())  # fitted head
    rows = (paths.plots / "serving_tau.csv").read_text().splitlines()
    assert rows[0] == "drafter,domain,run,draftline_tau,vllm_tau" and len(rows) == 1 + 3 * 2 * 3


@pytest.mark.slow
@needs_vllm
def test_batched_acceptance_stays_within_tolerance_of_single_request_acceptance(served):
    """Every served drafter accepts as much with requests sharing vLLM's batches as one request at a time
    (prompts of different lengths: the batch holds requests at different positions)."""
    _, report = served
    for kind in ("ar", "block", "eagle3"):
        for domain, record in report["drafters"][kind]["domains"].items():
            assert record["batch_tau_gap"] <= report["max_batch_tau_gap"], (kind, domain, record["batch_tau_gap"])


@pytest.mark.slow
@needs_vllm
def test_vllms_cpu_build_refuses_the_dspark_export_and_serve_check_records_it_skipped(tmp_path):
    """The DSpark layout as export writes it, run through serve_check's engine: vLLM 0.32's CPU build refuses
    `method: dspark` (model runner V1), so the drafter is skipped with vLLM's reason, not failed. When a vLLM
    build runs it, this test fails and the DSpark variant can join the served checks."""
    from export.export import export_serving
    from export.launch_files import resolved_job
    from pipeline.drafters.block.model import DFlashConfig, DFlashDraftModel
    from pipeline.drafters.kinds import KINDS

    tokenizer = tiny_tokenizer()
    verifier = tiny_qwen3(len(tokenizer), hidden_size=128, num_layers=4, eos_token_id=tokenizer.eos_token_id,
                          pad_token_id=tokenizer.pad_token_id)
    verifier.save_pretrained(tmp_path / "verifier")
    tokenizer.save_pretrained(tmp_path / "verifier")
    config = DFlashConfig(hidden_size=128, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=32, intermediate_size=256, vocab_size=len(tokenizer), block_size=K + 1,
                          num_target_layers=4, dflash_config={"mask_token_id": tokenizer.mask_token_id,
                                                              "target_layer_ids": [0, 2]},
                          markov_rank=16, enable_confidence_head=True)
    DFlashDraftModel(config).save_pretrained(tmp_path / "drafter")
    tokenizer.save_pretrained(tmp_path / "drafter")
    export_serving(KINDS["block"], tmp_path / "drafter", tmp_path / "export", tmp_path / "export",
                   str(tmp_path / "verifier"), tokenizer, tmp_path)
    job = resolved_job(json.loads((tmp_path / "export" / "vllm.json").read_text()), tmp_path / "export")
    assert job["speculative_config"]["method"] == "dspark"
    params = _params(tmp_path, max_new_tokens=8)
    prompts = {"code": prompt_ids(tokenizer)[:1]}
    engine = serve_check.engine_job(job["model"], job["speculative_config"], prompts, params)
    result = serve_check.run_engine(serve_python(), engine, "dspark", tmp_path, params.serve_check)
    assert result.get("error"), "vLLM ran the DSpark drafter: compare it in serve_check instead of skipping it"
    entry = serve_check.check_drafter(engine, result, {"runs": {}}, None, params.serve_check)
    assert entry["status"] == "skipped", result["error"]
    assert "does not support: dspark" in entry["reason"]


@pytest.mark.slow
@needs_vllm
def test_launch_mds_command_serves_every_drafter_and_agrees_with_the_in_process_run(served):
    """Each drafter is also served by the line its launch.md shows for this vLLM build, driven by OpenAI
    completions requests; that run passes the same rule and agrees with the in-process run."""
    from pipeline.server_process import on_cpu

    paths, report = served
    program = "python -m vllm.entrypoints.openai.api_server --model " if on_cpu() else "vllm serve "
    for kind in ("ar", "block", "eagle3"):
        launch = report["drafters"][kind]["launch_command"]
        assert launch["ran"] and launch["agrees_with_in_process"], launch
        assert launch["command"].startswith(program) and launch["command"] in (paths.export(kind) / "launch.md").read_text()
        assert set(launch["domains"]) == {"code", "text"}
        for record in launch["domains"].values():
            for name in ("single", "batched"):
                assert record[name]["outputs_identical"] and record[name]["vllm"]["num_drafts"] > 0
            assert record["sampled"]["T=0.8"]["vllm"]["num_drafts"] > 0
    assert report["launch_command_wall_s"] > 0 and "ignores per-request seeds" in report["sampled_note"]


def test_a_moved_project_serves_its_own_files(tmp_path, monkeypatch, capsys):
    """vllm.json names the files inside the artifacts dir relative to the export: after the project moves (and
    the original is gone), serve_check's jobs and launch.md's command point at the moved project's files."""
    from transformers import AutoTokenizer

    from export.export import export_serving
    from pipeline.drafters.kinds import KINDS
    from serve_eval.launch_check import launch_argv
    from tests.support.workspace import tiny_workspace

    original = tiny_workspace(tmp_path / "original")
    paths = ArtifactPaths(original / "artifacts", original / "metrics", original / "plots")
    tokenizer = AutoTokenizer.from_pretrained(paths.verifier)
    export_serving(KINDS["ar"], paths.drafter("ar"), paths.export("ar"), paths.export("ar"),
                   str(paths.verifier.resolve()), tokenizer, paths.root)
    assert str(original) not in (paths.export("ar") / "vllm.json").read_text()
    assert str(original) in (paths.export("ar") / "launch.md").read_text()  # for pasting: absolute
    moved = tmp_path / "moved"
    shutil.move(original, moved)
    monkeypatch.chdir(moved)

    params = serve_check.ServeCheckParams.model_validate({"export": {"kinds": ["ar"]}})
    job = serve_check.exported_jobs(params, ArtifactPaths.from_params(params))["ar"]
    assert job["model"] == str((moved / "artifacts" / "verifier").resolve())
    assert job["speculative_config"]["model"] == str((moved / "artifacts" / "export" / "ar" / "serving").resolve())
    assert Path(job["model"]).is_dir() and Path(job["speculative_config"]["model"]).is_dir()

    argv = launch_argv(moved / "artifacts" / "export" / "ar", job, cpu=True)
    assert job["model"] in argv and str(original) not in " ".join(argv)
    assert "dvc repro -f export" in capsys.readouterr().err  # launch.md still shows where it was exported
