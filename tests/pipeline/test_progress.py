"""Progress bars stay short in a log file: `make demo > log` must not get a line per step."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import time
from pipeline import progress
progress.LOG_INTERVAL_S = {interval}
bar = progress.progress(desc="steps", total=400)
for step in range(400):
    time.sleep(0.002)
    bar.update(1)
    bar.set_postfix(loss=step)  # as the training loops do, every step
bar.close()
"""


def _bar_lines(interval: float) -> int:
    result = subprocess.run([sys.executable, "-c", SCRIPT.format(interval=interval)], cwd=REPO,
                            capture_output=True, text=True, check=True)
    return sum(1 for line in result.stderr.replace("\r", "\n").splitlines() if line.startswith("steps"))


def test_a_bar_in_a_log_file_writes_a_few_lines_not_one_per_step():
    assert _bar_lines(30.0) <= 3
    assert _bar_lines(0.0) > 20  # the same bar refreshing freely: what the interval prevents
