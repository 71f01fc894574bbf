"""A stage leaves no process behind: a signal to the `dvc repro` that started it, or to the stage itself,
ends the stage and every process it started, their children included (pipeline/process_tree.py).

Each case is a real process tree: a parent standing in for DVC, the stage runner (`pipeline.cli.run_stage`),
and what the stage starts (an engine-like child with a worker of its own).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl and /proc are Linux's")

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
# A stage that starts an engine-like child (`sh`, exec'ed into `sleep`) with a worker of its own (the
# background `sleep`), prints its own, the child's and the worker's pid, then waits. `swallow`: a library
# that catches the interrupt and carries on (the stage must end anyway, after its grace period); `convert`:
# one that turns it into its own (as Lightning's graceful shutdown and training's re-raise do).
STAGE = """
import subprocess, sys, time
import pipeline.cli as cli
from pipeline.config.stage_params import StageParams

cli.EXIT_GRACE_S = 2.0
mode = sys.argv[2]

def run(params, args):
    child = subprocess.Popen(["sh", "-c", "sleep 300 & echo $!; exec sleep 300"], stdout=subprocess.PIPE, text=True)
    worker = child.stdout.readline().strip()
    print("started", child.pid, worker, flush=True)
    while True:
        try:
            time.sleep(300)
        except KeyboardInterrupt:
            if mode == "convert":
                raise KeyboardInterrupt from None
            if mode != "swallow":
                raise

sys.exit(cli.run_stage(cli.stage_parser("t", "t"), StageParams, run, ["--params", sys.argv[1]]))
"""
# Stands in for DVC: starts the stage as its own child, passes on the stage's line, waits until killed.
PARENT = ("import os, subprocess, sys; "
          "child = subprocess.Popen([sys.executable, '-c', sys.argv[1], *sys.argv[2:]], env=os.environ, "
          "stdout=subprocess.PIPE, text=True); "
          "print(child.pid, child.stdout.readline().strip(), flush=True); child.wait()")


@pytest.fixture
def params(tmp_path) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text("{}\n")
    return path


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for whoever inherited it to collect its status."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def _all_gone(pids: list[int], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(map(_alive, pids))


def _kill_leftovers(pids: list[int]) -> None:
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _pids(line: str) -> list[int]:
    """"<stage> started <child> <worker>" -> [stage, child, worker]."""
    stage, started, child, worker = line.split()
    assert started == "started", line
    return [int(stage), int(child), int(worker)]


def test_sigterm_to_dvc_ends_the_stage_and_everything_it_started(params):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, STAGE, str(params), "unwind"], cwd=REPO,
                              env={**ENV, "DVC_STAGE": "evaluate"}, stdout=subprocess.PIPE, text=True)
    pids = _pids(parent.stdout.readline())
    try:
        time.sleep(0.5)
        parent.send_signal(signal.SIGTERM)  # `kill -TERM` of dvc repro
        parent.wait(timeout=30)
        assert _all_gone(pids, 20), [pid for pid in pids if _alive(pid)]
    finally:
        _kill_leftovers(pids)


def _hangups_by_default() -> None:
    """A suite run under `nohup` passes SIGHUP ignored to every child, and a stage keeps an ignored SIGHUP
    ignored (as nohup means); the stage under test is one started from a terminal."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _stage(params: Path, mode: str) -> tuple[subprocess.Popen, list[int]]:
    process = subprocess.Popen([sys.executable, "-c", STAGE, str(params), mode], cwd=REPO, env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=_hangups_by_default)
    line = process.stdout.readline()
    time.sleep(0.3)
    return process, _pids(f"{process.pid} {line}")


@pytest.mark.parametrize("mode", ["unwind", "convert"])
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_signalled_stage_names_the_signal_and_ends_its_children(params, signum, code, mode):
    process, pids = _stage(params, mode)
    try:
        process.send_signal(signum)
        _, err = process.communicate(timeout=30)
        assert process.returncode == code
        assert err.strip() == f"draftline: terminated ({signal.Signals(signum).name})"
        assert _all_gone(pids, 10), [pid for pid in pids if _alive(pid)]
    finally:
        _kill_leftovers(pids)


def test_a_stage_that_swallows_the_signal_is_ended_after_its_grace_period(params):
    process, pids = _stage(params, "swallow")
    try:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
        assert process.returncode == 143 and "did not stop within 2 s of SIGTERM" in err
        assert _all_gone(pids, 10), [pid for pid in pids if _alive(pid)]
    finally:
        _kill_leftovers(pids)


def test_a_stage_started_under_nohup_keeps_ignoring_sighup(params):
    process = subprocess.Popen([sys.executable, "-c", STAGE, str(params), "unwind"], cwd=REPO, env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    pids = _pids(f"{process.pid} {process.stdout.readline()}")
    try:
        time.sleep(0.3)
        process.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert process.poll() is None and all(map(_alive, pids))  # the hangup changed nothing
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
        assert process.returncode == 143 and err.strip() == "draftline: terminated (SIGTERM)"
        assert _all_gone(pids, 10), [pid for pid in pids if _alive(pid)]
    finally:
        _kill_leftovers(pids)
