"""The `evaluate` stage end to end on tiny artifacts built in a tmp dir."""

import json

import pytest
import torch
from datasets import Dataset, DatasetDict

from data_prep.verifier import write_record
from pipeline.lineage import model_identity
from serve_eval.evaluate import main
from tests.test_spec_loops import block_model
from tests.tiny_models import save_tiny_eagle3, save_tiny_verifier, tiny_qwen3

DOMAIN_KEYS = {"acceptance_rate", "tau", "speedup", "tokens_per_s", "baseline_tokens_per_s", "draft_time_s",
               "verify_time_s", "per_position_acceptance", "prompts"}


def corpus_rows(tokenizer, count):
    texts = {"code": "def add(a, b):\n    return a + b\n", "text": "The quick brown fox jumps over the"}
    rows = []
    for i in range(count):
        for domain, text in texts.items():
            ids = tokenizer(text + " " * i)["input_ids"]
            rows.append({"id": f"{domain}-{i}", "domain": domain, "source": "test", "prompt": text,
                         "prompt_ids": ids, "response_ids": ids[:4], "finish_reason": "length",
                         "temperature": 0.0, "seed": 0})
    return Dataset.from_list(rows)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval_project")
    artifacts = root / "artifacts"
    verifier, tokenizer = save_tiny_verifier(artifacts / "verifier")
    write_record(artifacts / "verifier", source="bootstrap", name_or_path=str(artifacts / "verifier"),
                 id_prefix="test")
    split = corpus_rows(tokenizer, 2)
    DatasetDict(train=split, validation=split, test=split).save_to_disk(str(artifacts / "corpus"))
    drafter = tiny_qwen3(len(tokenizer), num_layers=1, seed=5, eos_token_id=tokenizer.eos_token_id)
    drafter.save_pretrained(artifacts / "drafters" / "ar")
    tokenizer.save_pretrained(artifacts / "drafters" / "ar")
    (artifacts / "drafters" / "ar" / "training.json").write_text(json.dumps({"kind": "ar", "draft_tokens": 4}))
    block = block_model(verifier, 4)
    block.save_pretrained(artifacts / "drafters" / "block")
    tokenizer.save_pretrained(artifacts / "drafters" / "block")
    save_tiny_eagle3(verifier, tokenizer, artifacts / "drafters" / "eagle3", draft_tokens=3, draft_vocab_size=200)
    return root


def write_params(root, **evaluate):
    settings = {"prompts_per_domain": 2, "max_new_tokens": 6, "temperatures": [0.0, 0.8], **evaluate}
    (root / "params.yaml").write_text(json.dumps({"evaluate": settings}))
    return str(root / "params.yaml")


def test_evaluate_writes_contract_metrics_and_plots(project, monkeypatch):
    monkeypatch.chdir(project)
    assert main(["--params", write_params(project)]) == 0
    report = json.loads((project / "metrics" / "eval.json").read_text())
    assert set(report["verifier"]) == {"id", "hash"} and report["corpus_hash"]
    assert report["library_versions"]["torch"] == torch.__version__
    assert set(report["drafters"]) == {"ar", "block", "eagle3"}
    for kind, entry in report["drafters"].items():
        assert entry["backend"] == "torch"
        # bound to what it measured: promotion recomputes this hash and refuses on a difference
        assert entry["drafter_identity"] == model_identity(project / "artifacts" / "drafters" / kind)
        assert entry["mismatches"] == 0 and entry["lossless"] is True
        assert set(entry["by_temperature"]) == {"0.0", "0.8"}
        for domains in entry["by_temperature"].values():
            assert set(domains) == {"code", "text"}
            for metrics in domains.values():
                assert DOMAIN_KEYS <= set(metrics)
                assert metrics["prompts"] == 2 and metrics["tau"] >= 1.0
                assert 0.0 <= metrics["acceptance_rate"] <= 1.0
    assert "hf_assisted_tokens_per_s" in report["drafters"]["ar"]["by_temperature"]["0.0"]["code"]
    greedy = report["drafters"]["ar"]["by_temperature"]["0.0"]["code"]
    assert len(greedy["speedup_runs"]) == 3 and greedy["speedup"] == sorted(greedy["speedup_runs"])[1]
    for name in ("eval_acceptance.csv", "eval_tau_hist.csv", "eval_acceptance.png", "eval_tau_hist.png"):
        assert (project / "plots" / name).stat().st_size > 0
    header = (project / "plots" / "eval_acceptance.csv").read_text().splitlines()[0]
    assert header == "series,drafter,temperature,domain,position,acceptance"


def test_missing_drafter_is_a_clear_error(project, monkeypatch, capsys, tmp_path):
    empty = tmp_path / "empty"
    (empty / "artifacts").mkdir(parents=True)
    for name in ("verifier", "corpus"):
        (empty / "artifacts" / name).symlink_to(project / "artifacts" / name)
    monkeypatch.chdir(empty)
    assert main(["--params", write_params(empty, drafters=["block"])]) == 1
    assert "drafter 'block' not found" in capsys.readouterr().err
    assert not (empty / "metrics").exists()


def test_onnx_backend_without_export_is_a_clear_error(project, monkeypatch, capsys):
    monkeypatch.chdir(project)
    assert main(["--params", write_params(project, drafters=["ar"], backend="onnx")]) == 1
    assert "model.onnx missing" in capsys.readouterr().err


def test_generate_prints_highlighted_tokens_and_step_stats(project, monkeypatch, capsys):
    from serve_eval.generate import main as generate_main

    monkeypatch.chdir(project)
    params = write_params(project)
    assert generate_main(["--params", params, "--prompt", "def add(a, b):", "--max-new-tokens", "6"]) == 0
    err = capsys.readouterr().err
    assert "step   0: drafted" in err and "tau (tokens per verifier forward, bonus included)" in err
    assert generate_main(["--params", params, "--prompt", "The fox", "--drafter", "block",
                          "--temperature", "0.8", "--max-new-tokens", "6"]) == 0


@pytest.mark.parametrize("args, expected", [
    (["--temperature", "nan"], "--temperature: must be in [0, 5]"),
    (["--temperature", "-1"], "--temperature: must be in [0, 5]"),
    (["--temperature", "inf"], "--temperature: must be in [0, 5]"),
    (["--max-new-tokens", "0"], "--max-new-tokens: must be >= 1"),
])
def test_generate_rejects_bad_arguments(project, monkeypatch, capsys, args, expected):
    from serve_eval.generate import main as generate_main

    monkeypatch.chdir(project)
    with pytest.raises(SystemExit) as info:
        generate_main(["--params", write_params(project), "--prompt", "x", *args])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


def test_generate_refuses_to_run_past_the_verifier_context(project, monkeypatch, capsys):
    from serve_eval.generate import main as generate_main

    monkeypatch.chdir(project)
    assert generate_main(["--params", write_params(project), "--prompt", "x", "--max-new-tokens", "100000"]) == 1
    err = capsys.readouterr().err.strip()
    assert "exceeds the verifier's context" in err and "\n" not in err


def test_trust_remote_code_comes_from_params_not_the_artifact(project, monkeypatch):
    """Editing artifacts/verifier/verifier.json must never switch on running a model's own code."""
    import data_prep.verifier as verifier_module
    from pipeline.paths import ArtifactPaths

    record_path = project / "artifacts" / "verifier" / "verifier.json"
    record = json.loads(record_path.read_text())
    record_path.write_text(json.dumps({**record, "trust_remote_code": True}))
    seen = []
    monkeypatch.setattr(verifier_module, "load_model_and_tokenizer",
                        lambda location, dtype, trust_remote_code, allow_pickle_weights: seen.append(trust_remote_code))
    try:
        verifier_module.load_verifier(ArtifactPaths(project / "artifacts", project, project))
        verifier_module.load_verifier(ArtifactPaths(project / "artifacts", project, project), trust_remote_code=True)
    finally:
        record_path.write_text(json.dumps(record))
    assert seen == [False, True]


def test_speedup_is_the_median_repeat_and_its_spread_is_recorded():
    from pipeline.drafters.speculative_loop import Generation
    from serve_eval.cell_sums import CellSums

    tally = CellSums()
    for repeat, (spec_s, base_s) in enumerate([(1.0, 2.0), (4.0, 2.0), (1.0, 1.5)]):  # one repeat hit by load
        spec, base = Generation([1], [5] * 8, wall_s=spec_s), Generation([1], [5] * 8, wall_s=base_s)
        if repeat == 0:
            tally.add(spec, base)
        tally.add_time(repeat, spec, base)
    metrics = tally.metrics()
    assert metrics["speedup_runs"] == [2.0, 0.5, 1.5] and metrics["speedup"] == 1.5
    assert metrics["speedup_spread"] == 1.0  # (2.0 - 0.5) / 1.5


def test_evaluate_says_when_the_timing_is_too_noisy(project, monkeypatch, capsys):
    monkeypatch.chdir(project)
    assert main(["--params", write_params(project, temperatures=[0.0], drafters=["ar"], peer_baseline=False,
                                          max_speedup_spread=1e-9)]) == 0
    assert "too noisy for the speed gate to decide" in capsys.readouterr().err
    cell = json.loads((project / "metrics/eval.json").read_text())["drafters"]["ar"]["by_temperature"]["0.0"]
    assert all(metrics["speedup_noisy"] is True for metrics in cell.values())  # promote reads it
