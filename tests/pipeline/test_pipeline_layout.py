"""dvc.yaml and the CLI agree with the code: every stage command is a runnable module with --help."""

import ast
import importlib.util
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.cli import COMMANDS
from pipeline.drafters.registry import KIND_SPECS
from pipeline.dvc_pipeline import PACKAGES, code_deps, entry_modules, import_closure, imported_modules

REPO = Path(__file__).resolve().parents[2]
STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
FLOW = ["bootstrap_verifier", "build_corpus", "extract_features", *(f"train_{name}" for name in KIND_SPECS), "export", "evaluate",
        "serve_check", "promote"]


def test_dvc_stages_cover_the_whole_flow():
    assert list(STAGES) == FLOW


@pytest.mark.parametrize("stage", FLOW)
def test_stage_command_is_a_module_with_main(stage):
    argv = shlex.split(STAGES[stage]["cmd"])
    assert argv[:2] == ["python", "-m"]
    spec = importlib.util.find_spec(argv[2])
    assert spec is not None, f"{stage}: module {argv[2]} does not exist"
    module = importlib.import_module(argv[2])
    assert callable(module.main)


@pytest.mark.parametrize("stage", FLOW)
def test_stage_code_deps_exist(stage):
    for dep in STAGES[stage].get("deps", []):
        if not dep.startswith("${project."):
            assert (REPO / dep).exists(), f"{stage}: dep {dep} does not exist"


@pytest.mark.parametrize("stage", FLOW)
def test_stage_params_are_schema_sections(stage):
    from pipeline.config.schema import Params

    dumped = Params().model_dump()
    for key in STAGES[stage].get("params", []):
        node = dumped
        for part in key.split("."):
            assert part in node, f"{stage}: params key {key} is not in the schema"
            node = node[part]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_cli_command_has_help(command):
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", command, "--help"], capture_output=True, text=True, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout


def _code_deps(stage: str) -> list[str]:
    return [dep for dep in STAGES[stage].get("deps", []) if dep.split("/")[0] in PACKAGES]


@pytest.mark.parametrize("stage", FLOW)
def test_stage_deps_are_its_import_closure(stage):
    """Editing a file a stage runs must rerun it; editing one it does not run must not."""
    from pipeline.dvc_pipeline import stages

    closure = set(code_deps(stages()[stage]))
    listed: set[str] = set()
    for dep in _code_deps(stage):
        path = REPO / dep
        listed |= {p.relative_to(REPO).as_posix() for p in path.rglob("*.py")} if path.is_dir() else {dep}
    missing, extra = sorted(closure - listed), sorted(listed - closure)
    assert not missing, f"{stage}: dvc.yaml deps lack files the stage imports: {missing}"
    assert not extra, f"{stage}: dvc.yaml deps list files the stage never imports: {extra}"


def _source_files(*packages: str) -> list[Path]:
    return sorted(path for package in packages for path in (REPO / package).rglob("*.py"))


def test_only_a_kinds_own_package_branches_on_its_name():
    """Stages iterate over `pipeline.drafters.kinds.KINDS`; a comparison with a kind's name outside
    `pipeline/drafters/<kind>/` is a branch a new kind would have to be added to."""
    from pipeline.config.base import DRAFTER_NAMES

    homes = tuple(REPO / "pipeline" / "drafters" / name for name in DRAFTER_NAMES)
    offenders = []
    for path in _source_files(*PACKAGES):
        if any(path.is_relative_to(home) for home in homes):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                for operand in operands:
                    values = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
                    if any(isinstance(v, ast.Constant) and v.value in DRAFTER_NAMES for v in values):
                        offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
            # a table keyed by kind names (`{"ar": ..., "block": ...}`, `x["ar"]`) is a branch too
            keys = node.keys if isinstance(node, ast.Dict) else [node.slice] if isinstance(node, ast.Subscript) else []
            if any(isinstance(key, ast.Constant) and key.value in DRAFTER_NAMES for key in keys):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, f"kind-name branches outside pipeline/drafters/<kind>/: {offenders}"


EXPORT_AND_SERVING_MODULES = ("/onnx.py", "/onnx_io.py", "/onnx_spec.py", "/onnx_parity.py", "/serving.py", "/interface.py")


def test_training_imports_no_export_or_evaluation_code():
    """Editing ONNX, served-layout or evaluation code must not retrain a drafter (dvc deps = imports)."""
    for stage in (f"train_{name}" for name in KIND_SPECS):
        closure = import_closure(*entry_modules(STAGES[stage]["cmd"]))
        offenders = sorted(path for path in closure if path.startswith(("export/", "serve_eval/"))
                           or path.endswith(EXPORT_AND_SERVING_MODULES))
        assert not offenders, f"{stage} imports {offenders}"


def test_export_and_serve_eval_do_not_import_train():
    offenders = [f"{path.relative_to(REPO)} imports {name}" for path in _source_files("export", "serve_eval")
                 for name in imported_modules(path) if name.split(".")[0] == "train"]
    assert not offenders, offenders


STAGE_PACKAGES = ("data_prep", "train", "export", "serve_eval")


def test_pipeline_imports_no_stage_package():
    """Imports run one way: the stage packages build on `pipeline/` (shared code and the kinds), never the
    reverse, so what two stages share lives in `pipeline/`. Function-level imports count too."""
    offenders = []
    for path in _source_files("pipeline"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            offenders += [f"{path.relative_to(REPO)}:{node.lineno} imports {name}" for name in names
                          if name.split(".")[0] in STAGE_PACKAGES]
    assert not offenders, f"pipeline/ imports stage packages: {offenders}"


def test_registry_has_every_drafter_name():
    from pipeline.config.base import DRAFTER_NAMES
    from pipeline.drafters.kinds import KINDS

    assert sorted(KINDS) == sorted(DRAFTER_NAMES)
    assert all(kind.name == name for name, kind in KINDS.items())
    for spec in KIND_SPECS.values():
        assert callable(spec.module("training").recipe), spec.package


def test_dvc_paths_follow_the_params_that_move_them(tmp_path):
    """dvc.yaml takes artifact, metrics and plots dirs from params.yaml (DVC templating), so moving them
    in params moves what DVC tracks to where the stages write (`pipeline.paths.ArtifactPaths`)."""
    from dvc.repo import Repo

    from pipeline.config.schema import Params
    from pipeline.paths import ArtifactPaths

    project = {"artifacts_dir": "run/arts", "metrics_dir": "run/metrics", "plots_dir": "run/plots"}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"project": project}))
    (tmp_path / "dvc.yaml").write_text((REPO / "dvc.yaml").read_text())
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=tmp_path, check=True)
    stages = {stage.name: stage for stage in Repo(str(tmp_path)).index.stages}
    tracked = {str(out.def_path) for stage in stages.values() for out in stage.outs}
    tracked |= {str(dep.def_path) for stage in stages.values() for dep in stage.deps if str(dep.def_path).startswith("run/")}
    assert all(path.startswith("run/") for path in tracked if not path.endswith(".py")), sorted(tracked)
    paths = ArtifactPaths.from_params(Params.model_validate({"project": project}))
    for kind in KIND_SPECS:
        for expected in (paths.drafter(kind), paths.checkpoints(kind)):
            assert expected.as_posix() in tracked, expected
    for expected in (paths.verifier, paths.corpus, paths.corpus_shards, paths.metrics / "eval.json",
                     paths.plots / "eval_acceptance.png"):
        assert expected.as_posix() in tracked, expected


def test_module_basenames_in_pipeline_name_one_job():
    """Two modules with one basename in pipeline/ must be the same job for different kinds
    (`pipeline/drafters/<kind>/model.py`), never two jobs sharing a name."""
    from pipeline.config.base import DRAFTER_NAMES

    by_name: dict[str, list[Path]] = {}
    for path in _source_files("pipeline"):
        if path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(path.relative_to(REPO))
    kind_dirs = {REPO.joinpath("pipeline", "drafters", name).relative_to(REPO) for name in DRAFTER_NAMES}
    clashes = {name: [str(p) for p in paths] for name, paths in by_name.items()
               if len(paths) > 1 and not all(p.parent in kind_dirs for p in paths)}
    assert not clashes, clashes
