"""Test-only, loaded by PYTHONPATH into a training subprocess: every optimizer step sleeps
$DRAFTLINE_TEST_STEP_SLEEP_S (default 50 ms), so a test can SIGKILL the run between two checkpoints however fast
the tiny drafter trains (tests/train/test_train_resume.py, test_multi_node.py). Sleeping changes no number the
run computes."""

import os
import time

from torch.optim.optimizer import register_optimizer_step_post_hook

PAUSE_S = float(os.environ.get("DRAFTLINE_TEST_STEP_SLEEP_S", "0.05"))
register_optimizer_step_post_hook(lambda optimizer, args, kwargs: time.sleep(PAUSE_S))
