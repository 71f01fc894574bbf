"""Shared infrastructure: typed params, the CLI, paths, atomic writes, lineage, integrity, MLflow, the gate."""
