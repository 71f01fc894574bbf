"""dvc.yaml is what pipeline/dvc_pipeline.py generates from the kinds' registry."""

import subprocess
import sys
from pathlib import Path

import yaml

from pipeline import dvc_pipeline
from pipeline.drafters.registry import KIND_SPECS

REPO = Path(__file__).resolve().parents[2]


def test_committed_dvc_yaml_is_the_generated_one():
    committed = (REPO / "dvc.yaml").read_text(encoding="utf-8")
    assert committed == dvc_pipeline.generate(), "dvc.yaml is stale: run `python -m pipeline.dvc_pipeline`"


def test_check_mode_names_the_generator(tmp_path, monkeypatch):
    monkeypatch.setattr(dvc_pipeline, "DVC_YAML", tmp_path / "dvc.yaml")
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    assert dvc_pipeline.main(["--check"]) == 1
    assert dvc_pipeline.main([]) == 0 and dvc_pipeline.main(["--check"]) == 0


def test_every_kind_is_trained_and_read_downstream():
    stages = yaml.safe_load(dvc_pipeline.generate())["stages"]
    for name in KIND_SPECS:
        assert stages[f"train_{name}"]["cmd"] == f"python -m train.dispatch --drafter {name}"
        assert f"train.{name}" in stages[f"train_{name}"]["params"]
        for reader in ("export", "evaluate", "serve_check", "promote"):
            assert f"${{project.artifacts_dir}}/drafters/{name}" in stages[reader]["deps"], (reader, name)


def test_a_kinds_training_does_not_depend_on_other_kinds_models():
    """Except the one it is built on: the DSpark kind runs the block family's code."""
    stages = yaml.safe_load(dvc_pipeline.generate())["stages"]
    built_on = {"dspark": "block"}
    for name in KIND_SPECS:
        others = [f"pipeline/drafters/{other}/model.py" for other in KIND_SPECS if other not in (name, built_on.get(name))]
        assert not set(others) & set(stages[f"train_{name}"]["deps"]), name
    assert "pipeline/drafters/block/model.py" in stages["train_dspark"]["deps"]


def test_generator_runs_as_a_module_without_the_stage_packages():
    code = ("import sys; import pipeline.dvc_pipeline as g; g.generate(); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'data_prep', 'train', 'export', 'serve_eval'}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert result.stdout.strip() == "[]"
