"""A stage runs on the inputs it names: what it reads is what params.yaml and dvc.yaml say, checked when it
runs, not only when DVC plans the run.

- The verifier record (`artifacts/verifier/verifier.json`) must be of the verifier params.yaml configures:
  after `verifier` changes and bootstrap_verifier fails, a stage would otherwise build on the old one.
- Under `dvc repro`, dvc.yaml must be what `python -m pipeline.dvc_pipeline` generates (a params dep deleted
  by hand, a prompt file it does not list), and the stage's code the project's own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from data_prep import build_corpus
from pipeline.config.schema import Params
from pipeline.errors import DraftlineError
from pipeline.paths import ArtifactPaths
from pipeline.verifier_record import configured_location, read_record, write_record
from tests.support.dvc_workspace import DVC, copy_project, env
from tests.support.tiny_models import save_tiny_verifier

REPO = Path(__file__).resolve().parents[2]


def _params(root: Path, verifier: dict | None = None) -> Path:
    """params.yaml for a tiny build_corpus in `root`: one prompt file, a few new tokens."""
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"def f{i}(x):"}) + "\n" for i in range(6)))
    params = {"project": {"artifacts_dir": str(root / "artifacts")},
              "corpus": {"sources": [{"kind": "file", "path": str(root / "prompts.jsonl"), "domain": "code"}],
                         "max_new_tokens": 4, "shard_size": 6, "split": {"validation": 0.2, "test": 0.2}}}
    if verifier:
        params["verifier"] = verifier
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return root / "params.yaml"


def test_build_corpus_refuses_a_record_of_another_verifier(tmp_path, capsys):
    """`verifier` switched to a directory bootstrap_verifier refused (no model in it): the record still names
    the demo verifier, and build_corpus must not build a corpus from that one."""
    verifier_dir = tmp_path / "artifacts" / "verifier"
    save_tiny_verifier(verifier_dir, num_layers=2)
    write_record(verifier_dir, source="bootstrap", name_or_path=str(verifier_dir), id_prefix="tiny")
    (tmp_path / "my-model").mkdir()
    params = _params(tmp_path, {"source": "hf", "name_or_path": str(tmp_path / "my-model")})
    capsys.readouterr()
    assert build_corpus.main(["--params", str(params)]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (f"draftline: error: {verifier_dir / 'verifier.json'} records the bootstrapped demo verifier, but "
                    f"params.yaml configures the external verifier {tmp_path / 'my-model'}; record the configured one "
                    "first: run `dvc repro bootstrap_verifier` (or `draftline bootstrap_verifier`)")
    assert not (tmp_path / "artifacts" / "corpus").exists()


def _paths(tmp_path: Path, verifier: dict) -> ArtifactPaths:
    return ArtifactPaths.from_params(Params.model_validate({"project": {"artifacts_dir": str(tmp_path / "artifacts")},
                                                            "verifier": verifier}))


def test_an_external_verifier_record_must_name_the_configured_model(tmp_path):
    models = {name: tmp_path / name for name in ("a", "b")}
    for model in models.values():
        save_tiny_verifier(model, num_layers=1)
    recorded = _paths(tmp_path, {"source": "hf", "name_or_path": str(models["a"])})
    write_record(recorded.verifier, source="hf", name_or_path=str(models["a"]), id_prefix="a", model_dir=models["a"],
                 configured=configured_location(recorded.verifier_config))
    assert read_record(recorded)["configured"] == str(models["a"].resolve())
    with pytest.raises(DraftlineError, match=rf"records the external verifier {models['a']}, but params.yaml "
                                             rf"configures the external verifier {models['b']}"):
        read_record(_paths(tmp_path, {"source": "hf", "name_or_path": str(models["b"])}))
    with pytest.raises(DraftlineError, match="but params.yaml configures the bootstrapped demo verifier"):
        read_record(_paths(tmp_path, {"source": "bootstrap"}))


def test_a_demo_verifier_trained_with_other_settings_is_refused(tmp_path):
    paths = _paths(tmp_path, {"bootstrap": {"num_layers": 4}})
    save_tiny_verifier(paths.verifier, num_layers=2)
    write_record(paths.verifier, source="bootstrap", name_or_path=str(paths.verifier), id_prefix="tiny")
    (paths.verifier / "bootstrap.json").write_text(json.dumps({"params": paths.verifier_config.bootstrap.model_dump()}))
    read_record(paths)
    with pytest.raises(DraftlineError, match="configures the bootstrapped demo verifier with other verifier.bootstrap"):
        read_record(_paths(tmp_path, {"bootstrap": {"num_layers": 6}}))


# --------------------------------------------------------------------------- dvc.yaml at stage start

# What `dvc repro` runs, reduced to the stage runner (a stage that does nothing once started).
STAGE = ("import sys; from pipeline.cli import run_stage, stage_parser; "
         "from pipeline.config.stage_params import StageParams; "
         "sys.exit(run_stage(stage_parser('t', 't'), StageParams, lambda p, a: None, ['--params', 'params.yaml']))")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("stage_start") / "repo"
    copy_project(repo)
    return repo


def _start(repo: Path, code: Path | None = None) -> subprocess.CompletedProcess:
    """A stage started by `dvc repro` in `repo` (DVC's environment), running `code`'s draftline (the repo's own).
    `-P`: the working directory does not come first on sys.path, as for the `draftline` script."""
    run_env = {**env(code or repo), "DVC_ROOT": str(repo), "DVC_STAGE": "evaluate"}
    return subprocess.run([sys.executable, "-P", "-c", STAGE], cwd=repo, env=run_env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.skipif(not DVC.exists(), reason="dvc is not installed next to this interpreter")
def test_a_stage_under_dvc_refuses_a_dvc_yaml_the_generator_does_not_make(project):
    assert _start(project).returncode == 0  # as generated
    dvc_yaml, params = project / "dvc.yaml", project / "params.yaml"
    generated, original = dvc_yaml.read_text(), params.read_text()
    try:
        edited = yaml.safe_load(generated)
        edited["stages"]["evaluate"]["params"].remove("evaluate")  # a params dep deleted by hand
        dvc_yaml.write_text(yaml.safe_dump(edited, sort_keys=False, width=120))
        done = _start(project)
        assert done.returncode == 1
        assert done.stderr.strip() == ("draftline: error: dvc.yaml is not what `python -m pipeline.dvc_pipeline` "
                                       "generates from params.yaml and the code (stages that differ: evaluate), so DVC "
                                       "does not track what this stage reads; run `python -m pipeline.dvc_pipeline` "
                                       "(and commit dvc.yaml), then rerun")
        dvc_yaml.write_text(generated)
        (project / "mine.jsonl").write_text('{"prompt": "def f(x):"}\n')  # a prompt file dvc.yaml does not list
        with_file = yaml.safe_load(original)
        with_file["corpus"]["sources"] = [{"kind": "file", "path": "mine.jsonl", "domain": "code"}]
        params.write_text(yaml.safe_dump(with_file))
        assert "stages that differ: build_corpus" in _start(project).stderr
    finally:
        dvc_yaml.write_text(generated)
        params.write_text(original)


def test_a_stage_under_dvc_refuses_code_from_another_checkout(project):
    done = _start(project, code=REPO)
    assert done.returncode == 1
    assert done.stderr.strip() == (f"draftline: error: dvc repro runs the project in {project}, but this stage's code "
                                   f"is {REPO}'s (an install or PYTHONPATH of another checkout); run the project's "
                                   f"own: `python -m <stage module>` from {project}, or PYTHONPATH={project}")
