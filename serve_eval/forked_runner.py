"""serve_check's vLLM engines forked from one runner process (`vllm_runner.py --fork-server`).

Each engine used to be a fresh interpreter that imported vLLM first: ~9 s of a ~14 s engine on 2 CPU cores,
five times per stage. The fork server imports it once and forks a process per engine, so each still starts
from the same just-imported state and dies alone; exit codes read as `subprocess` ones (−N: killed by
signal N), so serve_check treats a forked engine exactly as it treated a lone runner.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path

from pipeline.errors import DraftlineError
from pipeline.process_tree import die_with_parent
from pipeline.server_process import check_not_killed


class ForkedRunner:
    def __init__(self, python: Path, runner: Path, env: dict[str, str], log: Path):
        self.log = log
        with log.open("w", encoding="utf-8") as handle:
            self.process = subprocess.Popen([str(python), "-I", str(runner), "--fork-server"], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=handle, env=env, text=True,
                                            preexec_fn=die_with_parent)
        self.lines: queue.Queue[str] = queue.Queue()
        # a reader thread, so waiting for a line can time out (the pipe's buffering defeats select)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line.strip())
        self.lines.put("")  # end of output: the fork server exited

    def _answer(self, expected: str, timeout_s: float | None) -> int:
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            raise subprocess.TimeoutExpired("vllm_runner.py --fork-server", timeout_s) from None
        word, _, value = line.partition(" ")
        if word != expected:
            self.process.wait()
            check_not_killed(self.process.returncode, "the vLLM fork server", self.log)
            raise DraftlineError(f"the vLLM fork server answered {line!r} instead of {expected!r} (exit code "
                                 f"{self.process.returncode}): the serving environment's runner does not match this "
                                 f"draftline; log: {self.log}")
        return int(value)

    def run(self, job: Path, result: Path, log: Path, timeout_s: float) -> int:
        """Run one job in a forked engine; its exit code. Past `timeout_s` the engine is killed and
        `subprocess.TimeoutExpired` raised, as `subprocess.run(timeout=...)` does."""
        try:
            self.process.stdin.write(json.dumps([str(job), str(result), str(log)]) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # the server is gone: its exit (a signal's, say) is the answer read next
        deadline = time.monotonic() + timeout_s
        pid = self._answer("started", timeout_s)
        try:
            return self._answer("exited", max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)
            self._answer("exited", None)
            raise

    def close(self) -> None:
        try:
            self.process.stdin.close()
        except BrokenPipeError:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> ForkedRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
