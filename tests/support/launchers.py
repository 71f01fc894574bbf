"""docs/scaling.md's launch commands, run as they are written: several "nodes" of one CPU process each on
127.0.0.1, each a shell running the doc's line with its own `NODE_RANK` and working directory."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from pipeline.process_tree import descendants
from pipeline.server_process import free_port
from tests.support import REPO

SCALING_DOC = REPO / "docs" / "scaling.md"
PACED = REPO / "tests" / "support" / "paced_steps"
# what the launch block's `export` line sets; the tests set every one of them, with their own values
DOC_VARIABLES = ("NODES", "GPUS_PER_NODE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "KIND")
LAUNCHER_ENV_PREFIXES = ("RANK", "WORLD_SIZE", "LOCAL_", "NODE_RANK", "GROUP_RANK", "MASTER_", "SLURM_",
                         "TORCHELASTIC_", "PMI_", "OMPI_")


def doc_commands() -> dict[str, str]:
    """The commands of docs/scaling.md's launch block by their first word (export, draftline, torchrun, srun,
    deepspeed); continuation lines joined, comments dropped."""
    text = SCALING_DOC.read_text(encoding="utf-8")
    block = next(body for body in re.findall(r"```bash\n(.*?)```", text, re.S) if "torchrun" in body)
    joined = re.sub(r"\\\n\s*", " ", block)
    lines = [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return {line.split()[0]: line for line in lines}


def exported_variables(export_line: str) -> tuple[str, ...]:
    return tuple(assignment.split("=")[0] for assignment in export_line.split()[1:])


def srun_task(command: str) -> str:
    """What srun runs on every task: its command line without `srun` and srun's own `--option value` pairs."""
    words = command.split()[1:]
    while words and words[0].startswith("--"):
        words = words[2:]
    return " ".join(words)


def slurm_task_env(rank: int, tasks: int, per_node: int) -> dict[str, str]:
    """The variables srun sets for task `rank` of `tasks`, `per_node` a node, on nodes named 127.0.0.1."""
    return {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "draftline", "SLURM_NTASKS": str(tasks),
            "SLURM_NTASKS_PER_NODE": str(per_node), "SLURM_NNODES": str(tasks // per_node),
            "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank % per_node), "SLURM_NODEID": str(rank // per_node),
            "SLURM_NODELIST": ",".join(["127.0.0.1"] * (tasks // per_node))}


def clean_env(**variables: str) -> dict[str, str]:
    """This process's environment without any launcher's variables, plus `variables`; the venv's tools first on
    PATH (torchrun, deepspeed, draftline, python) as an activated venv has them."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(LAUNCHER_ENV_PREFIXES)}
    bin_dir = str(Path(sys.executable).parent)
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1", "MLFLOW_ENABLE_TELEMETRY": "false", **variables}


@dataclass
class Node:
    rank: int
    process: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def start_nodes(command: str, directories: list[Path], kind: str, *, per_node: int = 1,
                pause_s: float | None = None, task_env=None) -> list[Node]:
    """Run `command` (a doc line) in a shell per directory, each a node: NODE_RANK its index, the doc's other
    variables for `len(directories)` nodes of `per_node` processes on 127.0.0.1. `pause_s` paces every optimizer
    step (tests/support/paced_steps); `task_env(rank)` adds variables per node (srun's)."""
    port = str(free_port())
    nodes = []
    for rank, directory in enumerate(directories):
        variables = {"NODES": str(len(directories)), "GPUS_PER_NODE": str(per_node), "NODE_RANK": str(rank),
                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "KIND": kind}
        if pause_s is not None:
            variables.update(PYTHONPATH=f"{PACED}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                             DRAFTLINE_TEST_STEP_SLEEP_S=str(pause_s))
        if task_env is not None:
            variables.update(task_env(rank))
        log = directory / f"node{rank}.log"
        with log.open("w") as sink:
            process = subprocess.Popen(["bash", "-c", command], cwd=directory, env=clean_env(**variables),
                                       stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        nodes.append(Node(rank, process, log))
    return nodes


def kill_nodes(nodes: list[Node]) -> None:
    """SIGKILL every node's whole process tree (shell, launcher and trainers, which torchrun starts in sessions
    of their own), as a crashed machine would end them: no process gets to run a handler."""
    for node in nodes:
        for pid in (*descendants(node.process.pid), node.process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for node in nodes:
        node.process.wait()


def wait_nodes(nodes: list[Node], timeout: float) -> list[int]:
    """Every node's exit status; the nodes still running after `timeout` s are killed and the test fails."""
    try:
        return [node.process.wait(timeout=timeout) for node in nodes]
    except subprocess.TimeoutExpired:
        kill_nodes(nodes)
        raise AssertionError(f"the nodes did not finish in {timeout:.0f} s:\n"
                             + "\n".join(node.output()[-3000:] for node in nodes)) from None
