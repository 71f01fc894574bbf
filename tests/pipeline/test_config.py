import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.config.schema import Params, load_all, parse_all
from pipeline.errors import ParamsError

REPO = Path(__file__).resolve().parents[2]


def test_repo_params_yaml_is_valid():
    params = load_all(REPO / "params.yaml")
    assert params.verifier.source in ("bootstrap", "hf")


@pytest.mark.parametrize(
    "data, expected",
    [
        ({"corpus": {"batch_size": 0}}, "corpus.batch_size: Input should be greater than or equal to 1"),
        ({"train": {"ar": {"trainer": {"strategy": "zero9"}}}}, "train.ar.trainer.strategy:"),
        ({"verifier": {"sourse": "hf"}}, "verifier.sourse: unknown key"),
        ({"verifier": {"source": "hf"}}, "verifier.name_or_path is not set"),
        ({"export": {"profile": {"seq": [8, 1, 64]}}}, "export.profile.seq: expected min <= opt <= max"),
        ({"train": {"ar": {"loss": {"fkl": 0.0}}}}, "at least one of ce/fkl/rkl/tvd/jsd"),
        ({"evaluate": {"temperatures": [0.0, 9.0]}}, "temperatures must be in [0, 5]"),
        ({"corpus": {"sources": [{"kind": "file", "domain": "code"}]}}, "a 'file' source needs 'path'"),
        (["not", "a", "mapping"], "expected a mapping of sections"),
        ({"export": {"atol": float("inf")}}, "export.atol: Input should be a finite number"),
        ({"promote": {"gates": {"code": {"min_speedup": float("inf")}}}}, "min_speedup: Input should be a finite"),
        ({"promote": {"max_regression": float("nan")}}, "max_regression: Input should be a finite number"),
        ({"verifier": {"trust_remote_code": "yes"}}, "verifier.trust_remote_code: Input should be a valid boolean"),
        ({"export": {"kinds": ["ar", "ar"]}}, "export.kinds: duplicate drafter kinds ['ar']"),
        ({"evaluate": {"drafters": ["block", "block"]}}, "evaluate.drafters: duplicate drafter kinds"),
        ({"project": {"artifacts_dir": "/etc"}}, "artifacts_dir '/etc' is a top-level system directory"),
        ({"corpus": {"split": {"validation": 0.3, "test": 0.3}}}, "leaves less than half the prompts to train on"),
        ({"train": {"block": {"target_layer_ids": [0, 9]}}}, "out of range for the 6-layer bootstrap verifier"),
        ({"train": {"block": {"target_layer_ids": [1, 1]}}}, "must be distinct layer indices"),
        # inputs checked where they enter: output dirs, seeds, room for a draft
        ({"project": {"artifacts_dir": ""}}, "project: artifacts_dir is empty"),
        ({"project": {"metrics_dir": "  "}}, "project: metrics_dir is empty"),
        ({"project": {"artifacts_dir": "/", "allow_system_dirs": True}}, "artifacts_dir '/' is the filesystem root"),
        ({"project": {"seed": 2**64}}, "project.seed: Input should be less than or equal to 4294967295"),
        ({"corpus": {"seed": 2**63}}, "corpus.seed: Input should be less than or equal to 4294967295"),
        ({"evaluate": {"seed": -1}}, "evaluate.seed: Input should be greater than or equal to 0"),
        ({"serve_check": {"max_new_tokens": 4}, "train": {"ar": {"draft_tokens": 4}}, "export": {"kinds": ["ar"]}},
         "serve_check.max_new_tokens 4 is less than one draft of the ar drafter plus its bonus token (4 + 1)"),
        ({"serve_check": {"max_new_tokens": 7}}, "of the block drafter plus its bonus token (7 + 1)"),
        ({"promote": {"temperatures": [0.0, 0.6]}}, "promote.temperatures: 0.6 is not a temperature evaluate runs "
         "(evaluate.temperatures: [0.0, 0.8]); add it to evaluate.temperatures or remove it from promote.temperatures"),
        ({"promote": {"temperatures": [0.0, 0.0]}}, "promote.temperatures: duplicate temperatures ['0.0']"),
        ({"promote": {"temperatures": []}}, "promote.temperatures: List should have at least 1 item"),
    ],
)
def test_bad_params_give_one_line_naming_the_key(data, expected):
    with pytest.raises(ParamsError) as info:
        parse_all(data, "params.yaml")
    message = str(info.value)
    assert expected in message
    assert "\n" not in message
    assert info.value.exit_code == 2


ONE_SOURCE = {"sources": [{"kind": "file", "path": "prompts.jsonl", "domain": "stories"}]}


def test_domains_come_from_the_sources():
    params = parse_all({"corpus": ONE_SOURCE})  # the default gate and limit serve any domain
    assert params.corpus.domains() == {"stories"} and params.corpus.prompt_limit("stories") == 400
    assert params.promote.gate("stories") == params.promote.default_gate
    gated = parse_all({"corpus": ONE_SOURCE, "promote": {"gates": {"stories": {"min_tau": 2.0}}}})
    assert gated.promote.gate("stories").min_tau == 2.0
    by_field = {"sources": [{"kind": "file", "path": "p.jsonl", "domain_field": "kind"}]}
    assert parse_all({"corpus": by_field, "promote": {"gates": {"math": {}}}}).corpus.domains() is None


@pytest.mark.parametrize("data, expected", [
    ({"corpus": ONE_SOURCE, "promote": {"gates": {"code": {"min_tau": 1.2}}}},
     "promote.gates.code: no corpus source has domain 'code' (the sources give ['stories'])"),
    ({"promote": {"gates": {"a.b": {}}}}, "String should match pattern"),
])
def test_gate_for_a_domain_without_source_is_an_error(data, expected):
    with pytest.raises(ParamsError) as info:
        parse_all(data, "params.yaml")
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_the_gate_decides_at_every_evaluated_temperature_unless_told_otherwise():
    from pipeline.promote.promote import PromoteParams

    assert PromoteParams().gate_temperatures == ["0.0", "0.8"]
    assert PromoteParams.model_validate({"evaluate": {"temperatures": [0, 1]}}).gate_temperatures == ["0.0", "1.0"]
    greedy_only = PromoteParams.model_validate({"promote": {"temperatures": [0]}})
    assert greedy_only.gate_temperatures == ["0.0"]


def test_section_hash_changes_with_the_section_only():
    base = Params()
    changed = parse_all({"evaluate": {"max_new_tokens": 7}})
    assert base.section_hash("corpus") == changed.section_hash("corpus")
    assert base.section_hash("evaluate") != changed.section_hash("evaluate")


def _check(tmp_path, text):
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "params", "check", "--params", str(path)],
        capture_output=True, text=True, cwd=REPO,
    )


def test_cli_params_check_exit_codes(tmp_path):
    good = _check(tmp_path, yaml.safe_dump({"corpus": {"max_new_tokens": 8}}))
    assert good.returncode == 0, good.stderr
    assert "ok" in good.stdout

    bad = _check(tmp_path, yaml.safe_dump({"train": {"block": {"block_size": 1}}}))
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    assert bad.stderr.strip().count("\n") == 0
    assert "train.block.block_size" in bad.stderr

    broken = _check(tmp_path, "corpus: [unclosed\n")
    assert broken.returncode == 2
    assert "not valid YAML" in broken.stderr


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"corpus:\n  seed: 1\n  seed: 2\n", "duplicate key 'seed'"),
        (b"\xff\xfe\x00corpus: {}\n", "not UTF-8 text"),
    ],
)
def test_unreadable_params_files_give_one_line(tmp_path, content, expected):
    path = tmp_path / "params.yaml"
    path.write_bytes(content)
    with pytest.raises(ParamsError) as info:
        load_all(path)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_yaml_merge_keys_load_and_duplicates_stay_refused(tmp_path):
    """`<<: *anchor` was once refused as not valid YAML (the duplicate-key loader dropped merging)."""
    path = tmp_path / "params.yaml"
    path.write_text("evaluate: &shared\n  seed: 3\n  max_new_tokens: 16\n"
                    "corpus:\n  <<: *shared\n  max_new_tokens: 32\n")
    params = load_all(path)
    assert params.corpus.seed == 3 and params.corpus.max_new_tokens == 32  # a key beside the merge overrides it
    path.write_text("evaluate: &shared\n  seed: 3\ncorpus:\n  <<: *shared\n  seed: 1\n  seed: 2\n")
    with pytest.raises(ParamsError, match="duplicate key 'seed'"):
        load_all(path)


def test_params_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ParamsError, match="not a file"):
        load_all(tmp_path)


def test_system_dirs_need_the_explicit_flag():
    params = parse_all({"project": {"artifacts_dir": "/srv", "allow_system_dirs": True}})
    assert params.project.artifacts_dir == "/srv"


def test_params_check_warns_about_dirs_outside_the_project(tmp_path):
    result = _check(tmp_path, yaml.safe_dump({"project": {"artifacts_dir": str(tmp_path / "art")}}))
    assert result.returncode == 0
    assert "artifacts_dir" in result.stderr and "outside the project" in result.stderr


def test_version_flag():
    result = subprocess.run([sys.executable, "-m", "pipeline.cli", "--version"], capture_output=True, text=True,
                            cwd=REPO)
    assert result.returncode == 0 and result.stdout.startswith("draftline 0.")


def _dvc_read_keys() -> set[str]:
    """Keys dvc.yaml reads from params.yaml by name: per-key params deps and `${...}` path templates."""
    text = (REPO / "dvc.yaml").read_text()
    stages = yaml.safe_load(text)["stages"].values()
    keys = {key for stage in stages for key in stage.get("params", []) if isinstance(key, str)}
    return keys | set(re.findall(r"\$\{([\w.]+)\}", text))


def _leaves(node, path=()):
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    else:
        yield path, node


def test_params_yaml_states_only_what_the_demo_changes():
    """The schema's defaults are the recommended values; params.yaml repeating one is a second source of
    defaults that drifts. Exempt: what dvc.yaml reads from the file by name."""
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    effective, defaults = load_all(REPO / "params.yaml"), Params()
    dvc_keys = _dvc_read_keys()
    repeats = []
    for path, value in _leaves(raw):
        key = ".".join(path)
        if key in dvc_keys or value == {}:
            continue
        mine, default = effective, defaults
        for part in path:
            mine, default = getattr(mine, part), getattr(default, part)
        if mine == default:
            repeats.append(f"{key}: {value!r}")
    assert not repeats, f"params.yaml repeats schema defaults (delete them): {repeats}"


def test_params_yaml_repeat_check_catches_a_planted_repeat(tmp_path, monkeypatch):
    planted = yaml.safe_load((REPO / "params.yaml").read_text())
    planted["train"]["block"]["block_size"] = Params().train.block.block_size
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(planted))
    (tmp_path / "dvc.yaml").write_text((Path(__file__).resolve().parents[2] / "dvc.yaml").read_text())
    with pytest.raises(AssertionError, match="train.block.block_size"):
        test_params_yaml_states_only_what_the_demo_changes()


def test_no_default_is_described_as_demo_sized():
    """A default sized for the demo (rather than recommended) belongs in params.yaml, with its reason."""
    sources = sorted((REPO / "pipeline" / "config").glob("*.py")) + sorted((REPO / "pipeline" / "drafters").glob("*/config.py"))
    offenders = [f"{path.relative_to(REPO)}:{number}" for path in sources
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if re.search(r"sized (so|for) the demo|demo trains", line)]
    assert not offenders, offenders


def test_params_show_prints_every_effective_value(tmp_path):
    result = subprocess.run([sys.executable, "-m", "pipeline.cli", "params", "show"], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    shown = yaml.safe_load(result.stdout)
    assert shown == load_all(REPO / "params.yaml").model_dump(mode="json")
    assert shown["train"]["block"]["block_size"] == Params().train.block.block_size  # a default, not in the file


def test_block_trainer_keeps_its_own_defaults_when_some_keys_are_set():
    """The block drafter trains with Muon by default (train/block_recipe_bench.py measured it), the other kinds with AdamW, and
    stating any train.block.trainer key (as the demo does) keeps the block's defaults for the others."""
    params = parse_all({"train": {"block": {"trainer": {"max_steps": 5}}}})
    assert params.train.block.trainer.optimizer == "muon" and params.train.block.trainer.max_steps == 5
    assert params.train.ar.trainer.optimizer == "adamw" and params.train.eagle3.trainer.optimizer == "adamw"
    with pytest.raises(ParamsError, match="optimizer 'muon' cannot run under strategy 'deepspeed_stage_3'"):
        parse_all({"train": {"block": {"trainer": {"strategy": "deepspeed_stage_3"}}}})
