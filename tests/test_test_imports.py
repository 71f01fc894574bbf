"""Test modules share code through tests/support/ and tests/conftest.py only: a test module importing another
would run (and collect) its tests twice and tie the two files together."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_test_modules(source: str) -> list[str]:
    """The `test_*` modules of the tests package that `source` imports (absolute or relative)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            names = [base, *(base + ("" if base.endswith(".") else ".") + alias.name for alias in node.names)]
        else:
            continue
        found += [name for name in names
                  if name.startswith((".", "tests.")) and name.rpartition(".")[2].startswith("test_")]
    return found


def test_no_test_module_imports_another():
    planted = "from tests.export.test_export_onnx import write_params\nfrom . import test_gate\nimport tests.test_docs_pages\n"
    assert imported_test_modules(planted) == ["tests.export.test_export_onnx", ".test_gate", "tests.test_docs_pages"]
    offenders = {str(path.relative_to(TESTS)): imported for path in sorted(TESTS.rglob("*.py"))
                 if (imported := imported_test_modules(path.read_text(encoding="utf-8")))}
    assert not offenders, f"test modules import test modules (move what they share to tests/support/): {offenders}"
