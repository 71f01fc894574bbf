"""Training pieces every drafter kind shares: the recipe a kind hands the training stage, its Lightning
module's base, corpus data modules, distillation losses, agreement counters, the frozen verifier and its
output cache, decoded acceptance. Each kind's own training lives in `pipeline/drafters/<kind>/`; the stage
that runs it (loading, Trainer, checkpoints, saving) is `train/`."""
