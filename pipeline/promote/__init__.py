"""The promote stage: the promotion gate, the MLflow model registry, and `draftline registry`."""
