"""Training past one machine, run the way docs/scaling.md shows it: every kind as two "nodes" of one process
each on 127.0.0.1 (torchrun, srun's variables, the deepspeed launcher) under ZeRO-2 and ZeRO-3, against the
same global batch on one node of two processes. The command lines are the doc's own (tests/support/launchers.py).

What each asserts: the two-node drafter and loss curve equal the one-node ones (gloo reduces two ranks in a
fixed order: measured equal to the last bit, held here to 1e-5); a run whose nodes are all killed after a
checkpoint resumes on two nodes to the same result; and only global rank 0 writes metrics and MLflow: node 1 has
its own metrics dir and tracking store in its params, and neither may exist afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
import yaml
from mlflow import MlflowClient
from safetensors.torch import load_file

from pipeline.config.schema import parse_all
from pipeline.drafters.kinds import KINDS
from pipeline.process_tree import descendants
from tests.support.features import FEATURES_PARAMS, write_features
from tests.support.launchers import (
    DOC_VARIABLES,
    doc_commands,
    exported_variables,
    kill_nodes,
    slurm_task_env,
    srun_task,
    start_nodes,
    wait_nodes,
)
from tests.support.workspace import make_artifacts

STRATEGIES = ("deepspeed_stage_2", "deepspeed_stage_3")
STEPS, CHECKPOINT_EVERY = 12, 4
TIMEOUT_S = 240
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


def tiny_train(strategy: str, devices: int, num_nodes: int, **overrides) -> dict:
    """Every kind, tiny, with 2 x 4 rows a step whatever the launch: per process batch 4, two processes."""
    trainer = {**overrides, "strategy": strategy, "devices": devices, "num_nodes": num_nodes, "accelerator": "cpu",
               "optimizer": "adamw",  # ZeRO shards the optimizer: Muon needs whole matrices
               "batch_size": 4, "learning_rate": 0.01, "warmup_steps": 2, "max_steps": STEPS,
               "checkpoint_every_n_steps": CHECKPOINT_EVERY, "val_every_n_steps": 2}  # a loss point every 2 steps
    block = {"block_size": 4, "num_layers": 1, "anchors_per_sequence": 6, "trainer": trainer}
    return {"ar": {"num_layers": 1, "num_heads": 4, "num_kv_heads": 2, "trainer": trainer},
            "block": block, "dspark": {**block, "markov_rank": 8},
            "eagle3": {"ttt_steps": 3, "draft_tokens": 3, "draft_vocab_size": 120, "trainer": trainer}}


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """Verifier, corpus and the features every tiny kind reads, made once and copied into each project."""
    artifacts = make_artifacts(tmp_path_factory.mktemp("multi_node_template"))
    write_features(artifacts, tiny_train("auto", 1, 1))
    return artifacts


def write_node_params(directory: Path, artifacts: Path, train: dict) -> None:
    """params.yaml in `directory`: the shared `artifacts`, and this node's own metrics, plots and MLflow store."""
    directory.mkdir(parents=True, exist_ok=True)
    data = {"project": {"artifacts_dir": str(artifacts), "metrics_dir": str(directory / "metrics"),
                        "plots_dir": str(directory / "plots")},
            "train": train, "features": FEATURES_PARAMS,
            "tracking": {"uri": f"sqlite:///{directory / 'mlflow.db'}"}}
    parse_all(data)
    (directory / "params.yaml").write_text(yaml.safe_dump(data))


def project(root: Path, template: Path, strategy: str, devices: int, nodes: int, **trainer) -> list[Path]:
    """A directory per node, all sharing `root/artifacts` (a copy of the template): the first is the project."""
    artifacts = root / "artifacts"
    shutil.copytree(template, artifacts)
    directories = [root] + [root / f"node{rank}" for rank in range(1, nodes)]
    for directory in directories:
        write_node_params(directory, artifacts, tiny_train(strategy, devices, nodes, **trainer))
    return directories


def loss_curve(root: Path) -> dict[int, float]:
    """train/loss by step over every run in the project's store (a resumed run continues a killed one's)."""
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = sorted(client.search_runs([e.experiment_id for e in client.search_experiments()]),
                  key=lambda run: run.info.start_time)
    return {point.step: point.value for run in runs for point in client.get_metric_history(run.info.run_id, "train/loss")}


def assert_same_drafter(kind: str, root: Path, reference: Path) -> None:
    trained, expected = (load_file(path / "artifacts" / "drafters" / kind / "model.safetensors") for path in (root, reference))
    assert trained.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(trained[name], expected[name], **TOLERANCE, msg=f"{kind} {name} differs")
    # a killed run loses the points MLflow had not flushed yet: every point after the resume must be there
    curve, reference_curve = loss_curve(root), loss_curve(reference)
    assert {step for step in reference_curve if step > CHECKPOINT_EVERY} <= set(curve), (curve, reference_curve)
    common = sorted(set(curve) & set(reference_curve))
    torch.testing.assert_close(torch.tensor([curve[step] for step in common]),
                               torch.tensor([reference_curve[step] for step in common]), **TOLERANCE)
    info = json.loads((root / "artifacts" / "drafters" / kind / "training.json").read_text())
    assert info["steps"] == STEPS and info["world_size"] == 2


def assert_rank_zero_alone_wrote(kind: str, directories: list[Path]) -> None:
    root, *others = directories
    assert (root / "metrics" / f"train_{kind}.json").is_file()
    for directory in others:
        written = sorted(path.name for path in directory.iterdir())
        assert written == ["node1.log", "params.yaml"], written  # no metrics/, plots/, mlflow.db, mlruns/


_one_node: dict[tuple[str, str], Path] = {}


@pytest.fixture(scope="module")
def one_node(template, tmp_path_factory):
    """The reference per (kind, strategy): the doc's one-node command, Lightning starting 2 processes itself."""
    def run(kind: str, strategy: str) -> Path:
        if (kind, strategy) not in _one_node:
            root = tmp_path_factory.mktemp(f"one_node_{kind}_{strategy}")
            [directory] = project(root, template, strategy, devices=2, nodes=1)
            [status] = wait_nodes(start_nodes(doc_commands()["draftline"], [directory], kind, per_node=2), TIMEOUT_S)
            assert status == 0, (directory / "node0.log").read_text()[-4000:]
            _one_node[kind, strategy] = root
        return _one_node[kind, strategy]
    return run


def wait_for_checkpoint(checkpoints: Path, nodes, step: int) -> None:
    """Until step `step`'s checkpoint and the `last.ckpt` after it are complete (DeepSpeed writes `latest` last)."""
    step_latest, last_latest = checkpoints / f"step{step:06d}.ckpt" / "latest", checkpoints / "last.ckpt" / "latest"
    deadline = time.monotonic() + TIMEOUT_S
    while not (step_latest.exists() and last_latest.exists()
               and last_latest.stat().st_mtime >= step_latest.stat().st_mtime):
        assert all(node.process.poll() is None for node in nodes), "\n".join(node.output()[-3000:] for node in nodes)
        assert time.monotonic() < deadline, f"no checkpoint at step {step} within {TIMEOUT_S} s"
        time.sleep(0.05)


def test_the_docs_launch_block_is_what_these_tests_run():
    commands = doc_commands()
    assert set(commands) == {"export", "draftline", "torchrun", "srun", "deepspeed"}, commands
    assert exported_variables(commands["export"]) == DOC_VARIABLES
    assert srun_task(commands["srun"]).startswith("python -m train.dispatch --drafter $KIND")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("kind", KINDS)
def test_two_torchrun_nodes_equal_one_node_and_resume_after_a_kill(kind, strategy, tmp_path, template, one_node):
    reference = one_node(kind, strategy)
    directories = project(tmp_path, template, strategy, devices=1, nodes=2)
    command = doc_commands()["torchrun"]

    # every node killed (SIGKILL, launcher and trainer) once step 4's checkpoint is complete
    nodes = start_nodes(command, directories, kind, pause_s=0.3)
    wait_for_checkpoint(tmp_path / "artifacts" / "checkpoints" / kind, nodes, CHECKPOINT_EVERY)
    kill_nodes(nodes)
    assert not (tmp_path / "artifacts" / "drafters" / kind).exists()

    nodes = start_nodes(command, directories, kind)
    assert wait_nodes(nodes, TIMEOUT_S) == [0, 0], "\n".join(node.output()[-3000:] for node in nodes)
    assert "resuming from" in nodes[0].output()
    assert_same_drafter(kind, tmp_path, reference)
    assert_rank_zero_alone_wrote(kind, directories)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    statuses = sorted(run.info.status for run in client.search_runs(
        [e.experiment_id for e in client.search_experiments()]))
    assert statuses == ["FINISHED", "KILLED"]  # the killed run, marked by the resume, and the finished one


@pytest.mark.slow
def test_srun_tasks_equal_one_node(tmp_path, template, one_node):
    """srun is not installed here: each task is started with the variables srun sets (tests/support/launchers)."""
    kind, strategy = "block", "deepspeed_stage_3"
    directories = project(tmp_path, template, strategy, devices=1, nodes=2)
    nodes = start_nodes(srun_task(doc_commands()["srun"]), directories, kind,
                        task_env=lambda rank: slurm_task_env(rank, tasks=2, per_node=1))
    assert wait_nodes(nodes, TIMEOUT_S) == [0, 0], "\n".join(node.output()[-3000:] for node in nodes)
    assert_same_drafter(kind, tmp_path, one_node(kind, strategy))
    assert_rank_zero_alone_wrote(kind, directories)


@pytest.mark.slow
def test_the_deepspeed_launcher_without_ssh_equals_one_node(tmp_path, template, one_node):
    kind, strategy = "eagle3", "deepspeed_stage_2"
    directories = project(tmp_path, template, strategy, devices=1, nodes=2)
    for directory in directories:
        (directory / "hostfile").write_text("node0 slots=1\nnode1 slots=1\n")
    nodes = start_nodes(doc_commands()["deepspeed"], directories, kind)
    assert wait_nodes(nodes, TIMEOUT_S) == [0, 0], "\n".join(node.output()[-3000:] for node in nodes)
    assert_same_drafter(kind, tmp_path, one_node(kind, strategy))
    for directory in directories[1:]:
        (directory / "hostfile").unlink()
    assert_rank_zero_alone_wrote(kind, directories)


@pytest.mark.slow
def test_trainers_end_with_their_killed_launcher(tmp_path, template):
    """torchrun starts its workers in sessions of their own: SIGKILL the two torchruns alone and their workers
    must end too (parent-death signal), not train on as orphans holding the checkpoint lock."""
    directories = project(tmp_path, template, "deepspeed_stage_2", devices=1, nodes=2)
    nodes = start_nodes(doc_commands()["torchrun"], directories, "ar", pause_s=0.3)
    wait_for_checkpoint(tmp_path / "artifacts" / "checkpoints" / "ar", nodes, CHECKPOINT_EVERY)
    trainers = set()
    for node in nodes:
        [launcher] = [pid for pid in (node.process.pid, *descendants(node.process.pid))  # bash may exec it
                      if b"torchrun" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        trainers |= descendants(launcher)
        os.kill(launcher, signal.SIGKILL)
    assert trainers
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]
              for pid in trainers):
        assert time.monotonic() < deadline, "the trainers outlived their killed launchers by 30 s"
        time.sleep(0.1)
    wait_nodes(nodes, 30)
    assert not (tmp_path / "artifacts" / "drafters" / "ar").exists()


@pytest.fixture(scope="module")
def even_template(tmp_path_factory) -> Path:
    """16 training rows: 4 batches of 4, which two processes take one each per step with no padding, and one
    process accumulating 2 takes in the same pairs."""
    artifacts = make_artifacts(tmp_path_factory.mktemp("multi_node_even"), rows_per_split=(16, 4, 2))
    write_features(artifacts, tiny_train("auto", 1, 1))
    return artifacts


def exported_weights(root: Path, kind: str) -> dict[str, torch.Tensor]:
    """What the export stage wrote for `kind`: the served checkpoint's tensors and the ONNX graph's initializers."""
    import onnx
    from onnx import numpy_helper

    export = root / "artifacts" / "export" / kind
    assert json.loads((export / "parity.json").read_text())["passed"], (export / "parity.json").read_text()
    weights = {f"serving/{name}": tensor for name, tensor in load_file(export / "serving" / "model.safetensors").items()}
    graph = onnx.load(str(export / "model.onnx")).graph  # its external data file beside it
    weights.update({f"onnx/{init.name}": torch.from_numpy(numpy_helper.to_array(init).copy()) for init in graph.initializer
                    if init.data_type == onnx.TensorProto.FLOAT})
    return weights


@pytest.mark.slow
def test_a_two_node_zero3_drafter_exports_as_the_one_trained_in_one_process(tmp_path, even_template):
    """ZeRO-3 leaves each rank a shard of every weight; training gathers them into the drafter, so export takes
    the run as it is. One process accumulating 2 batches a step sees the same pairs of batches, so its drafter
    and export equal the two nodes' up to float summation order (AR: no per-rank randomness; the block kinds
    draw anchors per rank, so their single-process run differs by design)."""
    from export.export import main as export_main

    kind = "ar"
    two, one = tmp_path / "two", tmp_path / "one"
    directories = project(two, even_template, "deepspeed_stage_3", devices=1, nodes=2)
    nodes = start_nodes(doc_commands()["torchrun"], directories, kind)
    assert wait_nodes(nodes, TIMEOUT_S) == [0, 0], "\n".join(node.output()[-3000:] for node in nodes)
    [single] = project(one, even_template, "auto", devices=1, nodes=1, accumulate_grad_batches=2)
    [status] = wait_nodes(start_nodes(doc_commands()["draftline"], [single], kind), TIMEOUT_S)
    assert status == 0, (single / "node0.log").read_text()[-4000:]

    for root in (two, one):
        params = yaml.safe_load((root / "params.yaml").read_text())
        params["export"] = {"kinds": [kind], "tensorrt": "off", "parity_prompts": 2}
        (root / "params.yaml").write_text(yaml.safe_dump(params))
        assert export_main(["--params", str(root / "params.yaml")]) == 0
    sharded, single_process = exported_weights(two, kind), exported_weights(one, kind)
    assert sharded.keys() == single_process.keys() and any(name.startswith("onnx/") for name in sharded)
    for name, tensor in single_process.items():
        torch.testing.assert_close(sharded[name], tensor, rtol=1e-4, atol=1e-5, msg=f"{name} differs")
