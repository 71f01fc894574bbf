"""The `evaluate` stage end to end on tiny artifacts built in a tmp dir."""

import json
import shutil

import pytest
import torch

from pipeline.lineage import model_identity
from serve_eval.evaluate import main
from tests.support.workspace import evaluate_params

DOMAIN_KEYS = {"acceptance_rate", "tau", "speedup", "tokens_per_s", "baseline_tokens_per_s", "draft_time_s",
               "verify_time_s", "per_position_acceptance", "prompts"}


def test_evaluate_writes_contract_metrics_and_plots(tiny_workspace, monkeypatch):
    monkeypatch.chdir(tiny_workspace)
    assert main(["--params", evaluate_params(tiny_workspace, settled_spread=0.0)]) == 0
    report = json.loads((tiny_workspace / "metrics" / "eval.json").read_text())
    assert set(report["verifier"]) == {"id", "hash"} and report["corpus_hash"]
    assert report["library_versions"]["torch"] == torch.__version__
    assert set(report["drafters"]) == {"ar", "block", "dspark", "eagle3"}
    for kind, entry in report["drafters"].items():
        assert entry["backend"] == "torch"
        # bound to what it measured: promotion recomputes this hash and refuses on a difference
        assert entry["drafter_identity"] == model_identity(tiny_workspace / "artifacts" / "drafters" / kind)
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
        assert (tiny_workspace / "plots" / name).stat().st_size > 0
    header = (tiny_workspace / "plots" / "eval_acceptance.csv").read_text().splitlines()[0]
    assert header == "series,drafter,temperature,domain,position,acceptance"


def test_missing_drafter_is_a_clear_error(tiny_workspace, monkeypatch, capsys, tmp_path):
    empty = tmp_path / "empty"
    (empty / "artifacts").mkdir(parents=True)
    for name in ("verifier", "corpus"):  # copies: a project never reads another's files through symlinks
        shutil.copytree(tiny_workspace / "artifacts" / name, empty / "artifacts" / name)
    monkeypatch.chdir(empty)
    assert main(["--params", evaluate_params(empty, drafters=["block"])]) == 1
    assert "drafter 'block' not found" in capsys.readouterr().err
    assert not (empty / "metrics").exists()


def test_onnx_backend_without_export_is_a_clear_error(tiny_workspace, monkeypatch, capsys):
    monkeypatch.chdir(tiny_workspace)
    assert main(["--params", evaluate_params(tiny_workspace, drafters=["ar"], backend="onnx")]) == 1
    assert "model.onnx missing" in capsys.readouterr().err


def test_generate_prints_highlighted_tokens_and_step_stats(tiny_workspace, monkeypatch, capsys):
    from serve_eval.generate import main as generate_main

    monkeypatch.chdir(tiny_workspace)
    params = evaluate_params(tiny_workspace)
    assert generate_main(["--params", params, "--prompt", "def add(a, b):", "--max-new-tokens", "6"]) == 0
    printed = capsys.readouterr()
    assert "step   0: drafted" in printed.err and "tau (tokens per verifier forward, bonus included)" in printed.err
    # the generated text is the command's data: stdout (`draftline generate ... > out.txt`), the stats stderr
    assert printed.out.startswith("def add(a, b):") and "step" not in printed.out
    assert generate_main(["--params", params, "--prompt", "The fox", "--drafter", "block",
                          "--temperature", "0.8", "--max-new-tokens", "6"]) == 0


@pytest.mark.parametrize("args, expected", [
    (["--temperature", "nan"], "--temperature: must be in [0, 5]"),
    (["--temperature", "-1"], "--temperature: must be in [0, 5]"),
    (["--temperature", "inf"], "--temperature: must be in [0, 5]"),
    (["--max-new-tokens", "0"], "--max-new-tokens: must be >= 1"),
])
def test_generate_rejects_bad_arguments(tiny_workspace, monkeypatch, capsys, args, expected):
    from serve_eval.generate import main as generate_main

    monkeypatch.chdir(tiny_workspace)
    with pytest.raises(SystemExit) as info:
        generate_main(["--params", evaluate_params(tiny_workspace), "--prompt", "x", *args])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


def test_generate_refuses_to_run_past_the_verifier_context(tiny_workspace, monkeypatch, capsys):
    from serve_eval.generate import main as generate_main

    monkeypatch.chdir(tiny_workspace)
    assert generate_main(["--params", evaluate_params(tiny_workspace), "--prompt", "x", "--max-new-tokens", "100000"]) == 1
    err = capsys.readouterr().err.strip()
    assert "exceeds the verifier's context" in err and "\n" not in err


def test_trust_remote_code_comes_from_params_not_the_artifact(tiny_workspace, monkeypatch):
    """Editing artifacts/verifier/verifier.json must never switch on running a model's own code."""
    import data_prep.verifier as verifier_module
    from pipeline.paths import ArtifactPaths

    record_path = tiny_workspace / "artifacts" / "verifier" / "verifier.json"
    record = json.loads(record_path.read_text())
    record_path.write_text(json.dumps({**record, "trust_remote_code": True}))
    seen = []
    monkeypatch.setattr(verifier_module, "load_model_and_tokenizer",
                        lambda location, dtype, trust_remote_code, allow_pickle_weights: seen.append(trust_remote_code))
    try:
        paths = ArtifactPaths(tiny_workspace / "artifacts", tiny_workspace, tiny_workspace)
        verifier_module.load_verifier(paths)
        verifier_module.load_verifier(paths, trust_remote_code=True)
    finally:
        record_path.write_text(json.dumps(record))
    assert seen == [False, True]


def test_speedup_is_the_median_repeat_and_its_spread_is_recorded():
    from pipeline.drafters.speculative_loop import Generation
    from serve_eval.cell_sums import CellSums

    tally = CellSums()
    for repeat, (spec_s, base_s) in enumerate([(1.0, 2.0), (4.0, 2.0), (1.0, 1.5)]):  # one repeat hit by load
        spec, base = Generation([1], [5] * 8, wall_s=spec_s), Generation([1], [5] * 8, wall_s=base_s)
        tally.add_time(repeat, spec, base)
    metrics = tally.metrics()
    assert metrics["speedup_runs"] == [2.0, 0.5, 1.5] and metrics["speedup"] == 1.5
    assert metrics["speedup_spread"] == 1.0  # (2.0 - 0.5) / 1.5
    # a sampled pass draws its own tokens: each repeat's speedup is its own tokens/s ratio
    tally.add_time(3, Generation([1], [5] * 4, wall_s=1.0), Generation([1], [5] * 8, wall_s=1.0))
    assert tally.metrics()["speedup_runs"][3] == 0.5


def test_sampled_passes_draw_afresh_and_tau_counts_every_pass(tiny_workspace, monkeypatch):
    """Every pass seeds its runs anew: at T > 0 the passes decode different tokens and acceptance sums all of
    them; at T = 0 they decode the same tokens, counted once."""
    import serve_eval.evaluate as evaluate

    monkeypatch.chdir(tiny_workspace)
    outputs = []
    real_decode = evaluate.decode
    monkeypatch.setattr(evaluate, "decode", lambda *args, **kw: outputs.append(
        (kw["sampling"].temperature, kw.get("proposer") is not None, real_decode(*args, **kw))) or outputs[-1][2])
    params = evaluate_params(tiny_workspace, temperatures=[0.0, 0.8], drafters=["ar"], peer_baseline=False,
                             timing_repeats=2, settled_spread=1e9, max_new_tokens=16)
    assert main(["--params", params]) == 0
    cells = json.loads((tiny_workspace / "metrics/eval.json").read_text())["drafters"]["ar"]["by_temperature"]
    for key, temperature, passes in (("0.0", 0.0, 1), ("0.8", 0.8, 2)):
        for metrics in cells[key].values():
            assert metrics["passes"] == passes and metrics["prompts"] == 2
        runs = [g for t, drafted, g in outputs if t == temperature and drafted][1:]  # after the warm-up
        first, second = runs[:2], runs[2:4]  # the first domain's prompts, pass by pass
        same = [a.new_ids == b.new_ids for a, b in zip(first, second)]
        assert all(same) if temperature == 0 else not all(same)
        code = cells[key][sorted(cells[key])[0]]
        counted = first + second if temperature else first
        assert code["tau"] == sum(len(g.new_ids) for g in counted) / sum(g.verifier_forwards for g in counted)


def test_evaluate_says_when_the_timing_is_too_noisy(tiny_workspace, monkeypatch, capsys):
    monkeypatch.chdir(tiny_workspace)
    params = evaluate_params(tiny_workspace, temperatures=[0.0], drafters=["ar"], peer_baseline=False,
                             max_speedup_spread=1e-9)
    assert main(["--params", params]) == 0
    assert "too noisy for the speed gate to decide" in capsys.readouterr().err
    cell = json.loads((tiny_workspace / "metrics/eval.json").read_text())["drafters"]["ar"]["by_temperature"]["0.0"]
    assert all(metrics["speedup_noisy"] is True for metrics in cell.values())  # promote reads it


def test_the_baseline_runs_once_per_prompt_and_every_drafter_measures_as_if_alone(tiny_workspace, monkeypatch):
    """The verifier-only baseline decodes the same tokens whichever drafter it is timed against: evaluate runs
    it once per prompt and pass for all drafters, and each drafter's numbers equal an evaluation of it alone."""
    import serve_eval.evaluate as evaluate

    monkeypatch.chdir(tiny_workspace)
    calls = []
    real_decode = evaluate.decode
    monkeypatch.setattr(evaluate, "decode", lambda *args, **kw: calls.append(kw.get("proposer")) or real_decode(*args, **kw))
    settings = dict(temperatures=[0.0, 0.8], peer_baseline=False, timing_repeats=2)
    assert main(["--params", evaluate_params(tiny_workspace, **settings)]) == 0
    together = json.loads((tiny_workspace / "metrics/eval.json").read_text())["drafters"]
    cells, prompts_per_cell = 2 * 2, 2  # temperatures x domains
    baselines = calls.count(None)
    assert baselines == cells * (1 + prompts_per_cell * 2)  # a warm-up, then a run per prompt and pass
    assert len(calls) - baselines == len(together) * baselines  # each drafter: as many runs as the baseline

    for kind in ("block", "eagle3"):
        assert main(["--params", evaluate_params(tiny_workspace, drafters=[kind], **settings)]) == 0
        alone = json.loads((tiny_workspace / "metrics/eval.json").read_text())["drafters"][kind]
        for temperature, domains in alone["by_temperature"].items():
            for domain, metrics in domains.items():
                shared = together[kind]["by_temperature"][temperature][domain]
                for key in ("tau", "acceptance_rate", "per_position_acceptance", "prompts"):
                    assert shared[key] == metrics[key], (kind, temperature, domain, key)


@pytest.mark.parametrize("settled_spread, passes", [(1e9, 2), (0.0, 3)])
def test_passes_stop_at_two_when_every_drafters_spread_is_settled(tiny_workspace, monkeypatch, settled_spread,
                                                                  passes):
    """A third pass only where the first two disagree by more than `settled_spread` (then the median of three
    outvotes a pass that load ruined)."""
    monkeypatch.chdir(tiny_workspace)
    params = evaluate_params(tiny_workspace, temperatures=[0.0], drafters=["ar", "block"], peer_baseline=False,
                             timing_repeats=3, settled_spread=settled_spread)
    assert main(["--params", params]) == 0
    drafters = json.loads((tiny_workspace / "metrics/eval.json").read_text())["drafters"]
    for entry in drafters.values():
        for metrics in entry["by_temperature"]["0.0"].values():
            assert len(metrics["speedup_runs"]) == passes
