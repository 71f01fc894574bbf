"""serve_check on llama.cpp: every kind's GGUF (the block kind as its DSpark variant, which vLLM's CPU build cannot
serve) run by the `llama-server` line of its launch.md, greedy and sampled, single and parallel, under the same
pass rule as vLLM; the Q8_0 drafter's τ beside it."""

from __future__ import annotations

import json
import shlex

import pytest
import torch
import yaml
from datasets import DatasetDict

from export import gguf_files
from export.export import export_serving
from pipeline.config.schema import parse_all
from pipeline.drafters.kinds import KINDS
from pipeline.paths import ArtifactPaths
from pipeline.serving_rule import domain_failures
from pipeline.serving_venv import llamacpp_python
from pipeline.verifier_record import write_record
from serve_eval import launch_check, llamacpp_engine, serve_check
from tests.support.tiny_models import fit_block, save_tiny_eagle3, tiny_qwen3
from tests.support.workspace import corpus_rows, write_verifier

K = 3  # draft tokens of every kind (the block drafter's block is K + 1)
PEAK = 20.0  # the tiny verifier's LM head scale
SPEC_TYPES = {"ar": "draft-simple", "block": "draft-dflash", "dspark": "draft-dspark", "eagle3": "draft-eagle3"}

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(llamacpp_python() is None, reason="no .venv-llamacpp: `make serve-env` builds it")]


def _drafters(paths: ArtifactPaths, verifier, tokenizer) -> None:
    """AR: the verifier's first 2 layers (accepts often, not always); block (DFlash) and DSpark, tapping layers 0
    and 2 (llama.cpp has no input of a layer past the last), and EAGLE-3: all three fitted to the corpus prompts."""
    ar = tiny_qwen3(len(tokenizer), num_layers=2, seed=1, eos_token_id=tokenizer.eos_token_id)
    ar.load_state_dict(verifier.state_dict(), strict=False)
    ar.save_pretrained(paths.drafter("ar"))
    tokenizer.save_pretrained(paths.drafter("ar"))
    (paths.drafter("ar") / "training.json").write_text(json.dumps({"kind": "ar", "draft_tokens": K}))
    prompts = [row["prompt_ids"] for row in corpus_rows(tokenizer, 2)]
    for kind, markov_rank in (("block", 0), ("dspark", 8)):
        fit_block(verifier, tokenizer.mask_token_id, prompts, 60, block_size=K + 1, markov_rank=markov_rank,
                  ).save_pretrained(paths.drafter(kind))
        tokenizer.save_pretrained(paths.drafter(kind))
    save_tiny_eagle3(verifier, tokenizer, paths.drafter("eagle3"), draft_tokens=K, fit_prompts=prompts, fit_steps=40)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """serve_check run for real with vLLM left out (no `.venv-serve`, serve_check.required false): llama.cpp only."""
    work = tmp_path_factory.mktemp("llamacpp")
    params_path = work / "params.yaml"
    params_path.write_text(yaml.safe_dump({
        "project": {"artifacts_dir": str(work / "artifacts"), "metrics_dir": str(work / "metrics"),
                    "plots_dir": str(work / "plots")},
        "evaluate": {"temperatures": [0.0, 0.8]},
        "serve_check": {"prompts_per_domain": 2, "max_new_tokens": 16, "concurrency": 4, "required": False}}))
    paths = ArtifactPaths.from_params(parse_all(yaml.safe_load(params_path.read_text())))
    verifier, tokenizer = write_verifier(paths.verifier, "tiny")
    with torch.no_grad():  # peaked next-token distributions, as a trained model's: llama.cpp drafts at T > 0 from
        verifier.lm_head.weight.mul_(PEAK)  # the drafter's top 10 only, which a random model's flat ones defeat
    verifier.save_pretrained(paths.verifier)
    write_record(paths.verifier, source="bootstrap", name_or_path=str(paths.verifier), id_prefix="tiny")
    split = corpus_rows(tokenizer, 2)
    DatasetDict(train=split, validation=split, test=split).save_to_disk(str(paths.corpus))
    _drafters(paths, verifier, tokenizer)
    config = parse_all(yaml.safe_load(params_path.read_text())).export.gguf
    gguf_files.convert_verifier(paths.verifier, paths.root / "export", config)
    for name, kind in KINDS.items():
        export_serving(kind, paths.drafter(name), paths.export(name), paths.export(name),
                       str(paths.verifier.resolve()), tokenizer, paths.root)
        gguf_files.convert_drafter(name, paths.export(name) / "serving", paths.export(name), paths.verifier, config)
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("DRAFTLINE_SERVE_PYTHON", raising=False)
        patch.setattr(serve_check, "serve_python", lambda: None)
        assert serve_check.main(["--params", str(params_path)]) == 0
    return paths, json.loads((paths.metrics / "serving.json").read_text())


def test_every_kind_is_served_losslessly_by_its_launch_line_under_the_rule(served):
    """Greedy outputs identical single and parallel, single-request and sampled τ as draftline's; parallel τ is
    judged but not required: llama.cpp 11549 loses acceptance, at random, for requests drafting side by side
    (docs/serving.md#llamacpp), so a failure here may only be that one, and says so."""
    paths, report = served
    llamacpp = report["llamacpp"]
    assert llamacpp["baseline"]["error"] is None
    self_test = llamacpp["sampled_self_test"]["T=0.8"]  # the verifier drafting for itself, every sampled run
    assert 0 <= self_test["accepted"] <= self_test["drafted"] and self_test["drafted"] > 0, self_test
    config = parse_all({}).serve_check
    for kind in KINDS:
        entry = llamacpp["drafters"][kind]
        launch = next(line for line in (paths.export(kind) / "launch.md").read_text().splitlines()
                      if line.startswith("llama-server "))
        assert entry["command"] == launch and f"--spec-type {SPEC_TYPES[kind]}" in launch
        assert set(entry["domains"]) == {"code", "text"}, (kind, entry["reason"])
        for record in entry["domains"].values():
            for name, concurrency in (("single", 1), ("batched", 4)):
                assert record[name]["outputs_identical"] and record[name]["concurrency"] == concurrency
                assert record[name]["vllm"]["num_drafts"] > 0
            assert record["draftline_same_outputs"] == record["prompts"]
            assert record["single_tau_gap"] <= config.max_tau_gap, (kind, record["single_tau_gap"])
            assert record["sampled"]["T=0.8"]["vllm"]["num_drafts"] > 0
            # the rule promote rederives, on the recorded numbers: only parallel τ may fail it
            failures = domain_failures(record, config.max_tau_gap, config.max_batch_tau_gap, config.sampled_z)
            assert all("batched" in reason for reason in failures), (kind, failures)
        assert entry["status"] == ("passed" if entry["reason"] is None else "failed")
    for kind in ("block", "dspark", "eagle3"):  # fitted drafters: τ agreement is not vacuous
        assert any(r["single"]["vllm"]["tau"] > 1.5 for r in llamacpp["drafters"][kind]["domains"].values()), kind


def test_q8_0_drafter_is_lossless_with_its_tau_recorded(served):
    _, report = served
    for kind in KINDS:
        q8 = report["llamacpp"]["drafters"][kind]["q8_0"]
        for record in q8["domains"].values():
            assert record["single"]["outputs_identical"] and record["batched"]["outputs_identical"]
            assert record["single"]["vllm"]["tau"] >= 1.0


def test_an_aborted_server_is_named_by_its_fatal_line_not_the_backtrace(tmp_path):
    """llama.cpp 11549 aborting under parallel DFlash drafts, as logged in a demo run (abridged)."""
    log = tmp_path / "block.llamacpp.log"
    log.write_text("0.01.972.207 I slot      release: id  1 | task 300 | stop processing: n_tokens = 79\n"
                   "/workspace/thirdparty/llama.cpp/common/common.cpp:2245: get_sub_batch: failed to add token "
                   "1080055774 at index 6 (error -2, n = 14)\n[New LWP 7197]\n#29 0x000055bd88b7a081 in _start ()\n"
                   "[Inferior 1 (process 7196) detached]\n")
    assert llamacpp_engine.engine_error_line(log) == (
        "llama-server aborted: /workspace/thirdparty/llama.cpp/common/common.cpp:2245: get_sub_batch: failed to add "
        "token 1080055774 at index 6 (error -2, n = 14)")
    log.write_text("main: loading model\nerror: unknown argument: --spec-type\n")
    assert llamacpp_engine.engine_error_line(log) == launch_check.first_error_line(log)


def test_launch_line_without_speculation_is_the_reference():
    arguments = shlex.split("-m v.gguf -md d.gguf --spec-type draft-dflash --spec-draft-n-max 3 "
                            "--spec-draft-sampling probabilistic --host 127.0.0.1 --port 8080")
    assert llamacpp_engine.without_speculation(arguments) == ["-m", "v.gguf", "--host", "127.0.0.1", "--port", "8080"]
