"""A stage and every process it starts end together (Linux; elsewhere these are no-ops).

A stage starts engines, servers and launcher subprocesses, and they start their own workers. When the
stage ends (done, failed, signalled) none of them may go on running: an orphan keeps writing outputs DVC
no longer tracks, or holds the GPU the next run needs. So a stage

- becomes a child subreaper (PR_SET_CHILD_SUBREAPER): a worker whose parent (an engine's launcher, a
  shell) dies is re-parented to the stage rather than to init, so the stage still finds it;
- ends what it started on its way out (`end_started`): SIGTERM to every descendant that was not there
  when it started, SIGKILL to what is left after a grace period;
- has its direct children die with it even when it is SIGKILLed itself (`die_with_parent` as their
  `preexec_fn`: the kernel's parent-death signal).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
END_GRACE_S = 5.0  # what a descendant gets between SIGTERM and SIGKILL


def _prctl(option: int, *args) -> int:
    """prctl(2), or -1 where there is none (not Linux, no glibc)."""
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, *args)
    except (OSError, AttributeError):
        return -1


def die_with_parent() -> None:
    """The kernel sends this process SIGTERM when its parent exits, even by SIGKILL. Also a `preexec_fn`:
    the child it runs in dies with the process that started it."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def set_subreaper(on: bool) -> bool:
    """Make this process a child subreaper (or stop being one); returns whether it was one before."""
    before = ctypes.c_int(0)
    _prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(before))
    _prctl(PR_SET_CHILD_SUBREAPER, int(on))
    return bool(before.value)


def _living_children() -> dict[int, list[int]]:
    """parent pid -> pids of its children that have not exited (zombies are dead: left out)."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:  # gone meanwhile
                continue
            state, ppid = stat[stat.rindex(")") + 2:].split()[:2]  # the name may hold spaces and parentheses
            if state not in ("Z", "X"):
                children.setdefault(int(ppid), []).append(int(entry.name))
    return children


def descendants(pid: int | None = None) -> set[int]:
    """Every living process below `pid` (default: this one)."""
    children = _living_children()
    found: set[int] = set()
    todo = [os.getpid() if pid is None else pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _signal_all(pids: set[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _reap(pids: set[int]) -> None:
    """Collect the exit status of those that are this process's own children (re-parented ones included),
    so that they do not linger as zombies."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def _wait_gone(before: set[int], seen: set[int], seconds: float) -> set[int]:
    """Up to `seconds` for every descendant outside `before` to exit; those still living. `seen` collects
    every pid met, to reap."""
    deadline = time.monotonic() + seconds
    while True:
        left = descendants() - before
        seen |= left
        _reap(seen)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def end_started(before: set[int], grace_s: float = END_GRACE_S) -> None:
    """SIGTERM every descendant not in `before` (the ones this stage started, and theirs), then SIGKILL
    whatever of them still lives after `grace_s`."""
    started = descendants() - before
    if not started:
        return
    seen = set(started)
    _signal_all(started, signal.SIGTERM)
    left = _wait_gone(before, seen, grace_s)
    if left:
        _signal_all(left, signal.SIGKILL)
        _wait_gone(before, seen, 1.0)  # SIGKILL cannot be refused: only the kernel's own delay is left
    _reap(seen)
