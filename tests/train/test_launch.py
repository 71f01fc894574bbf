"""Launcher mistakes end in one line, fast: a rank that cannot exist,
more nodes configured than a launcher started, devices that differ from the processes per node, a port in use,
a peer that never joins; and a stage blocked in C++ (a rendezvous) still ends on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from pipeline.config.trainer_config import TrainerConfig
from tests.support import REPO
from tests.support.training import write_params
from train.launch import INTEGER_VARIABLES, Launch, LaunchError, check_port_free, read_launch

CPU = {"accelerator": "cpu"}
LAUNCHER_VARIABLES = (*INTEGER_VARIABLES, "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "SLURM_JOB_NAME")


def _read(env: dict, **trainer) -> Launch:
    return read_launch(TrainerConfig(**CPU, **trainer), "train.ar", env)


@pytest.mark.parametrize("env, trainer, expected", [
    ({"RANK": "5", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}, {}, "RANK=5 with WORLD_SIZE=2: a rank must be"),
    ({"SLURM_NTASKS": "2", "SLURM_PROCID": "2"}, {"devices": 2}, "SLURM_PROCID=2 with SLURM_NTASKS=2"),
    ({"RANK": "1", "WORLD_SIZE": "2"}, {}, "RANK=1 and WORLD_SIZE=2 set, but no launcher started this process"),
    ({}, {"num_nodes": 2}, "num_nodes is 2, but no launcher started this process"),
    ({"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}, {},
     "the launcher started 2 processes on this node (LOCAL_WORLD_SIZE), but train.ar.trainer.devices is 1; set devices: 2"),
    ({"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"},
     {"devices": 2}, "the launcher started 4 processes in all (WORLD_SIZE), but train.ar.trainer makes devices 2 x "
     "num_nodes 1 = 2"),
    # the deepspeed launcher on the second node sets RANK but not NODE_RANK: Lightning would rank it 0 again
    ({"RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_SIZE": "1"}, {"num_nodes": 2},
     "RANK=1, but Lightning would train this process as rank 0"),
    ({"RANK": "two"}, {}, "RANK='two' is not an integer"),
])
def test_a_launch_that_cannot_be_right_is_one_line(env, trainer, expected):
    with pytest.raises(LaunchError) as info:
        _read(env, **trainer)
    assert expected in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("env, trainer, rank", [
    ({}, {}, 0),
    ({}, {"devices": 2}, 0),  # Lightning starts both processes itself
    ({"TORCHELASTIC_RUN_ID": "x", "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
     {"devices": 2, "num_nodes": 2}, 3),
    ({"SLURM_NTASKS": "4", "SLURM_PROCID": "2", "SLURM_NTASKS_PER_NODE": "2"}, {"devices": 2, "num_nodes": 2}, 2),
    ({"RANK": "1", "LOCAL_RANK": "0", "NODE_RANK": "1", "WORLD_SIZE": "2", "LOCAL_SIZE": "1"}, {"num_nodes": 2}, 1),
    ({"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2"}, {"devices": 2}, 1),  # one Lightning started
])
def test_launches_as_the_docs_show_them_pass(env, trainer, rank):
    assert _read(env, **trainer).rank == rank


def test_a_port_in_use_is_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(LaunchError, match=f"MASTER_PORT {port} is already in use"):
            check_port_free({"MASTER_PORT": str(port)})
    check_port_free({"MASTER_PORT": str(port)})  # free again


def _env(**variables: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name not in LAUNCHER_VARIABLES}
    return {**env, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **variables}


def _train(tmp_path, env: dict, trainer: dict) -> tuple[subprocess.CompletedProcess, float]:
    """The train stage, before anything exists to train on: the launch is checked first thing."""
    params = write_params(tmp_path, {**CPU, **trainer})
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "train.dispatch", "--drafter", "ar", "--params", str(params)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    return result, time.monotonic() - started


def _last_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1, result.stderr[-3000:]
    return result.stderr.strip().splitlines()[-1]


def test_rank_beyond_the_world_size_fails_instead_of_exiting_0(tmp_path):
    result, _ = _train(tmp_path, _env(RANK="5", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1"), {})
    assert _last_line(result).startswith("draftline: error: RANK=5 with WORLD_SIZE=2: a rank must be")


def test_more_nodes_than_a_launcher_started_fails_fast(tmp_path):
    result, seconds = _train(tmp_path, _env(), {"num_nodes": 2})
    assert "num_nodes is 2, but no launcher started this process" in _last_line(result)
    assert seconds < 60


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_node_that_never_joins_ends_the_rendezvous_naming_it(tmp_path):
    env = _env(LOCAL_RANK="0", NODE_RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    result, seconds = _train(tmp_path, env, {"num_nodes": 2, "rendezvous_timeout_s": 3})
    line = _last_line(result)
    assert "rank 0 of 2: the rendezvous at 127.0.0.1:" in line and "did not complete within 3 s" in line
    assert "1/2 clients joined" in line and "start the missing node(s)" in line
    assert seconds < 60


# A stage blocked in C++ where Python's signal handlers never run: a rendezvous server waiting for a client.
BLOCKED_STAGE = ("import datetime, sys; import torch.distributed as dist; "
                 "from pipeline.cli import run_stage, stage_parser; from pipeline.config.stage_params import StageParams; "
                 "sys.exit(run_stage(stage_parser('t', 't'), StageParams, lambda p, a: (print('started', flush=True), "
                 "dist.TCPStore('127.0.0.1', 0, world_size=2, is_master=True, timeout=datetime.timedelta(seconds=300))), "
                 "['--params', sys.argv[1]]))")


def test_sigterm_ends_a_stage_blocked_in_a_rendezvous(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("{}\n")
    process = subprocess.Popen([sys.executable, "-c", BLOCKED_STAGE, str(params)], cwd=REPO, env=_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "started"
        time.sleep(1)  # into the blocking call
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 143 and err.strip() == "draftline: terminated (SIGTERM)"
