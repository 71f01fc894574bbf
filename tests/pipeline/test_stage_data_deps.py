"""Data deps are checked like code deps: every dvc.yaml stage that reads artifacts runs, by its own `cmd`,
on a tiny workspace under a read audit (tests/read_audit/sitecustomize.py), and each file or folder it
read there must lie under one of its deps (rendered with the workspace's `project.*` values) or its own
outputs; each data dep it declares must have been read (an unread one reruns it for nothing)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Iterable

import pytest
import yaml

from export.launch_files import resolved_job
from pipeline.drafters.registry import KIND_SPECS
from pipeline.verifier_record import write_record
from tests.support.tiny_models import save_tiny_verifier

REPO = Path(__file__).resolve().parents[2]
AUDIT = REPO / "tests" / "read_audit"
STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
PROJECT = {"artifacts_dir": "artifacts", "metrics_dir": "metrics", "plots_dir": "plots"}
PROJECT_VARIABLE = re.compile(r"\$\{project\.(\w+)\}")
# Files of the workspace that stages read but DVC cannot hold as deps, with why.
NOT_IN_THE_GRAPH = {
    "params.yaml": "DVC tracks it key by key, as each stage's `params`",
    "dvc.lock": "DVC's own record of the stages, written by DVC; promote logs it as lineage",
    "mlflow.db": "the MLflow store (tracking.uri): the stages that read it write it too",
}
# pipeline/atomic.py builds an output next to it as `.<name>.<8 random chars>.tmp` (figures: `.png`), then
# renames it into place: a read there is a read of that output.
STAGING = re.compile(r"^\.(?P<name>.+)\.[a-z0-9_]{8}\.(tmp|png)$")

TRAINER = {"batch_size": 4, "learning_rate": 0.01, "warmup_steps": 1, "max_seq_len": 32, "max_steps": 2,
           "val_every_n_steps": 1000, "checkpoint_every_n_steps": 1000}
# Smaller models for the kinds that have size knobs; a kind not named here trains its default size.
TINY_MODELS = {
    "ar": {"num_layers": 1, "num_heads": 4, "num_kv_heads": 2, "draft_tokens": 3},
    "block": {"block_size": 4, "num_layers": 1, "anchors_per_sequence": 2},
    "eagle3": {"ttt_steps": 2, "draft_tokens": 3, "draft_vocab_size": 120},
}
PARAMS = {
    "project": {"seed": 0, **PROJECT},
    "corpus": {"max_prompts_per_domain": 6, "prompt_max_tokens": 16, "max_new_tokens": 8},
    "features": {"max_seq_len": TRAINER["max_seq_len"]},  # the offline kinds' rows are cut where training cuts them
    "train": {name: {**TINY_MODELS.get(name, {}), "trainer": TRAINER} for name in KIND_SPECS},
    "tracking": {"uri": "sqlite:///mlflow.db"},
    "export": {"parity_prompts": 1, "parity_steps": 2, "tensorrt": "off"},
    "evaluate": {"prompts_per_domain": 1, "max_new_tokens": 4, "temperatures": [0.0], "timing_repeats": 1},
    # without vLLM every drafter fails serve_check; not required, so promote still registers (and reads) them all
    "serve_check": {"required": False, "prompts_per_domain": 1, "max_new_tokens": 4},
}


def render(path: str, project: dict) -> PurePosixPath:
    return PurePosixPath(PROJECT_VARIABLE.sub(lambda match: str(project[match.group(1)]), path))


def declared(stage: dict, project: dict) -> tuple[list[PurePosixPath], list[PurePosixPath]]:
    """A stage's data deps (those under a `${project.*}` dir; the rest are code) and its outputs."""
    deps = [render(dep, project) for dep in stage["deps"] if PROJECT_VARIABLE.match(dep)]
    outs = [render(out if isinstance(out, str) else next(iter(out)), project)
            for key in ("outs", "metrics", "plots") for out in stage.get(key, [])]
    return deps, outs


def final_path(path: PurePosixPath) -> PurePosixPath:
    """The output a staging path of pipeline/atomic.py becomes."""
    return PurePosixPath(*(STAGING.sub(r"\g<name>", part) for part in path.parts))


def within(path: PurePosixPath, roots: Iterable[PurePosixPath]) -> bool:
    return any(path == root or root in path.parents for root in roots)


def undeclared(reads: Iterable[str], stage: dict, project: dict) -> list[str]:
    """The reads (workspace-relative paths) that none of the stage's deps or outputs covers. A folder
    holding one of its outputs may be listed or opened: replacing an output atomically does that."""
    deps, outs = declared(stage, project)
    return sorted(str(read) for read in map(PurePosixPath, reads)
                  if str(read) not in NOT_IN_THE_GRAPH and not within(final_path(read), deps + outs)
                  and not any(read in out.parents for out in outs))


def unread(reads: Iterable[str], stage: dict, project: dict) -> list[str]:
    paths = [PurePosixPath(read) for read in reads]
    return [str(dep) for dep in declared(stage, project)[0] if not any(within(path, [dep]) for path in paths)]


def audited_reads(log: Path, workspace: Path, project: dict) -> set[str]:
    """The workspace paths in a read log that exist, or lie under a project dir (a probe for a missing
    artifact is a read too); the rest (the interpreter's own start-up probes) are not the stage's."""
    project_dirs = [PurePosixPath(project[key]) for key in PROJECT]
    reads = set()
    for line in log.read_text(encoding="utf-8").splitlines():
        path = Path(line.split("\t", 1)[1])
        if workspace in path.parents:
            relative = PurePosixPath(path.relative_to(workspace).as_posix())
            if path.exists() or within(relative, project_dirs):
                reads.add(str(relative))
    return reads


def build_workspace(root: Path) -> None:
    """What `bootstrap_verifier` leaves (a tiny verifier instead of the demo's), a dvc.lock, params.yaml."""
    verifier = root / PROJECT["artifacts_dir"] / "verifier"
    save_tiny_verifier(verifier, num_layers=2)
    write_record(verifier, source="bootstrap", name_or_path=str(verifier), id_prefix="tiny")
    (root / "params.yaml").write_text(yaml.safe_dump(PARAMS), encoding="utf-8")
    (root / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n", encoding="utf-8")


# A serving environment that reports a vLLM but whose engines do not start: serve_check reads all it
# reads before running vLLM, then records every drafter failed; what vLLM would load is `vllm_reads`.
# It answers as `python -I SCRIPT ...` would: lineage.py's versions, a lone runner (job, result) or the fork
# server (a job per stdin line, "started PID" and "exited CODE" each). `-I`: the read audit stays out of it.
STUB_SERVING_PYTHON = """
import json, os, sys

NO_ENGINE = {"error": "stub serving environment: no engine"}


def fail(result_path):
    with open(result_path, "w", encoding="utf-8") as handle:
        json.dump(NO_ENGINE, handle)


if sys.argv[2].endswith("lineage.py"):
    print(json.dumps({"python": "3", "vllm": "stub"}))
elif sys.argv[3:] == ["--fork-server"]:
    for line in sys.stdin:
        fail(json.loads(line)[1])
        print(f"started {os.getpid()}", flush=True)
        print("exited 0", flush=True)
else:
    fail(sys.argv[4])
"""


def stub_serving_env(root: Path) -> Path:
    python = root / "stub-serve-env" / "python"
    python.parent.mkdir(exist_ok=True)
    python.write_text(f"#!{sys.executable} -I\n{STUB_SERVING_PYTHON}", encoding="utf-8")
    python.chmod(0o755)
    return python


def run_stage(root: Path, name: str) -> set[str]:
    """The stage's dvc.yaml `cmd`, run in the workspace under the read audit; what it read there."""
    log = root / "reads" / name
    log.parent.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(AUDIT), str(REPO)]), "DRAFTLINE_READ_LOG": str(log),
           "PYTHONSAFEPATH": "1",  # the workspace is not on sys.path: import probes there are no stage's reads
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MLFLOW_ENABLE_TELEMETRY": "false",
           # no vLLM: export skips its checks in the serving env; serve_check's stops after reading (the stub)
           "DRAFTLINE_SERVE_PYTHON": str(stub_serving_env(root) if name == "serve_check" else root / "no-serve-env")}
    env.pop("MLFLOW_TRACKING_URI", None)
    argv = STAGES[name]["cmd"].split()
    result = subprocess.run([sys.executable, *argv[1:]], cwd=root, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"{name}: {result.stderr[-3000:]}"
    return audited_reads(log, root, PROJECT)


def vllm_reads(root: Path) -> set[str]:
    """What vLLM loads in serve_check, which runs in the serving env and is not audited here: the verifier
    and the drafter each export's vllm.json names."""
    reads = set()
    for kind in PARAMS["export"].get("kinds", KIND_SPECS):
        export_dir = root / PROJECT["artifacts_dir"] / "export" / kind
        job = resolved_job(json.loads((export_dir / "vllm.json").read_text()), export_dir)
        for path in (job["model"], job["speculative_config"]["model"]):
            reads.add(Path(path).relative_to(root.resolve()).as_posix())
    return reads


# Every stage that reads artifacts, in run order (dvc.yaml's order); bootstrap_verifier reads none.
READERS = [name for name, stage in STAGES.items() if declared(stage, PROJECT)[0]]


@pytest.fixture(scope="module")
def stage_reads(tmp_path_factory) -> dict[str, set[str]]:
    root = tmp_path_factory.mktemp("data_deps").resolve()  # as the stages' os.getcwd() spells it
    build_workspace(root)
    reads = {name: run_stage(root, name) for name in READERS}
    reads["serve_check"] |= vllm_reads(root)
    return reads


@pytest.mark.slow
@pytest.mark.parametrize("name", READERS)
def test_a_stage_reads_only_its_deps_and_every_data_dep(stage_reads, name):
    reads = stage_reads[name]
    missing, idle = undeclared(reads, STAGES[name], PROJECT), unread(reads, STAGES[name], PROJECT)
    assert not missing, f"{name} reads what its deps do not list (see pipeline/dvc_pipeline.py): {missing}"
    assert not idle, f"{name} lists data deps it never reads: {idle}"


@pytest.mark.slow
def test_a_drafter_missing_from_exports_deps_is_caught(stage_reads):
    """With eagle3's drafter dir left out of export's deps, the files export reads there are named."""
    eagle3 = "${project.artifacts_dir}/drafters/eagle3"
    doctored = {**STAGES["export"], "deps": [dep for dep in STAGES["export"]["deps"] if dep != eagle3]}
    missed = undeclared(stage_reads["export"], doctored, PROJECT)
    assert "artifacts/drafters/eagle3/model.safetensors" in missed
    assert all(within(PurePosixPath(path), [PurePosixPath("artifacts/drafters/eagle3")]) for path in missed)


STAGE = {"deps": ["${project.artifacts_dir}/verifier", "${project.artifacts_dir}/drafters/ar",
                  "${project.metrics_dir}/eval.json", "export/export.py"],
         "outs": ["${project.artifacts_dir}/export"],
         "metrics": [{"${project.metrics_dir}/export.json": {"cache": False}}]}


def test_reads_outside_the_deps_are_named():
    reads = {"artifacts/verifier/config.json", "artifacts/drafters/ar/model.safetensors", "metrics/eval.json",
             "artifacts/drafters/eagle3/model.safetensors", "metrics/serving.json", "plots/eval_tau_hist.csv"}
    assert undeclared(reads, STAGE, PROJECT) == ["artifacts/drafters/eagle3/model.safetensors",
                                                 "metrics/serving.json", "plots/eval_tau_hist.csv"]


def test_own_outputs_staging_copies_and_their_folders_are_covered():
    reads = {"artifacts/export/ar/model.onnx", "artifacts/export/.ar.x1y2z3_q.tmp/model.onnx", "artifacts",
             "metrics/.export.json.a1b2c3d4.tmp", "metrics", "params.yaml", "mlflow.db", "dvc.lock"}
    assert undeclared(reads, STAGE, PROJECT) == []
    # a staging copy of something else, and a folder holding only deps, are reads like any other
    assert undeclared({"artifacts/drafters/.eagle3.x1y2z3_q.tmp/a.bin", "artifacts/drafters"}, STAGE, PROJECT) == [
        "artifacts/drafters", "artifacts/drafters/.eagle3.x1y2z3_q.tmp/a.bin"]


def test_deps_render_with_the_workspace_project_dirs_and_unread_ones_are_named():
    project = {"artifacts_dir": "/data/run1", "metrics_dir": "m", "plots_dir": "p"}
    deps, outs = declared(STAGE, project)
    assert deps == [PurePosixPath("/data/run1/verifier"), PurePosixPath("/data/run1/drafters/ar"),
                    PurePosixPath("m/eval.json")]
    assert outs == [PurePosixPath("/data/run1/export"), PurePosixPath("m/export.json")]
    assert unread({"artifacts/verifier/config.json", "metrics/eval.json"}, STAGE, PROJECT) == ["artifacts/drafters/ar"]
