"""`speculators train` (vllm-project/speculators 0.9.0) on a CPU-only machine, nothing else changed.

0.9.0's Trainer assumes an accelerator: it moves the model to `local_rank` 0, calls
`torch.accelerator.synchronize()` and falls back to autocast on 'cuda'. This shim makes the device 'cpu',
autocast 'cpu' and the synchronize a no-op, then runs speculators' own CLI with the arguments given.
Runs in the speculators environment (README.md beside this file), not draftline's; imports nothing of draftline.
"""

import sys

import torch

if __name__ == "__main__":
    if not torch.accelerator.is_available():
        torch.accelerator.synchronize = lambda *args, **kwargs: None
    import speculators.train.trainer as trainer
    from speculators.__main__ import app

    trainer.get_local_rank = lambda: "cpu"
    setup_model = trainer.Trainer.setup_model

    def setup_model_on_cpu(self, *args, **kwargs):
        self.device_type = "cpu"
        return setup_model(self, *args, **kwargs)

    trainer.Trainer.setup_model = setup_model_on_cpu
    sys.argv = ["speculators", *sys.argv[1:]]
    app()
