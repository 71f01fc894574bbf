import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.config import Params, ParamsError, load_params, parse_params

REPO = Path(__file__).resolve().parents[1]


def test_repo_params_yaml_is_valid():
    params = load_params(REPO / "params.yaml")
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
    ],
)
def test_bad_params_give_one_line_naming_the_key(data, expected):
    with pytest.raises(ParamsError) as info:
        parse_params(data, "params.yaml")
    message = str(info.value)
    assert expected in message
    assert "\n" not in message
    assert info.value.exit_code == 2


def test_section_hash_changes_with_the_section_only():
    base = Params()
    changed = parse_params({"evaluate": {"max_new_tokens": 7}})
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
