import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")

import torch  # noqa: E402

# Two cores: keep intra-op threads small so parallel processes in tests do not oversubscribe.
torch.set_num_threads(2)

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_verifier_dir(tmp_path_factory):
    """A random tiny Qwen3 verifier + BPE tokenizer saved as an HF checkpoint dir."""
    from tests.support.tiny_models import save_tiny_verifier

    directory = tmp_path_factory.mktemp("tiny_verifier")
    save_tiny_verifier(directory)
    return directory


@pytest.fixture(scope="module")
def tiny_workspace(tmp_path_factory):
    """A project dir with a tiny verifier, corpus and one tiny untrained drafter of every kind; the stages
    that read drafters run in it (`tests.support.workspace.tiny_workspace`)."""
    from tests.support.workspace import tiny_workspace

    return tiny_workspace(tmp_path_factory.mktemp("workspace"))
