"""Drafter kinds, one package each (`ar/`, `block/`): model, ONNX wrapper and I/O spec, serving layout
and launch snippets, decoding proposer. Stages reach them through `pipeline.drafters.kinds`."""
