"""What the tests share: tiny models, tiny workspaces and the helpers that run stages on them. Not a test
module: test modules import from here, never from each other (tests/test_test_imports.py)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
