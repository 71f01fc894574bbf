"""Drafter kinds, one package each (listed in `registry.py`): params section, model, training recipe and
Lightning module, ONNX wrapper and I/O spec, serving layout and launch snippets, decoding proposer. Stages
reach them through `pipeline.drafters.kinds` (behaviour) and `pipeline.drafters.registry` (names, configs)."""
