"""Test-only, loaded by PYTHONPATH into a training subprocess: every optimizer step sleeps 50 ms, so a test can
SIGKILL the run between two checkpoints however fast the tiny drafter trains (tests/train/test_train_resume.py).
Sleeping changes no number the run computes."""

import time

from torch.optim.optimizer import register_optimizer_step_post_hook

register_optimizer_step_post_hook(lambda optimizer, args, kwargs: time.sleep(0.05))
