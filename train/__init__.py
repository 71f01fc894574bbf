"""Drafter models and their distillation (Lightning + DeepSpeed)."""
