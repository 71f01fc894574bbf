"""No comment or doc points at something the repository does not hold.

Every text file of the repository (Python, Markdown, YAML, TOML, Makefile, CI script) is read, and a
line fails when it
- cites the old out-of-repository design reference (its file name, or "section N" of it): the design
  lives in docs/algorithms.md;
- cites a tracker issue or pull request by number (a reader of the repository has no tracker): say
  what the thing is instead;
- names a repository path that does not exist: a backticked path under a top-level folder or file of
  the repository, a backticked relative path like `block/model.py` (a suffix of no tracked path), a
  backticked Python file name outside tests/ (other projects' files are listed), a plain path under
  one of the packages, or a Markdown link to a local file;
- names a module or attribute of the packages that does not exist (`pipeline.config.base.DrafterName`
  resolves; a moved name does not); `train.*` and `export.*` that are not modules read as params keys;
- cites an anchor of a docs/ page (`docs/algorithms.md#<anchor>`, or `#<anchor>` inside the page)
  that the page does not define.
External paths (vLLM's `v1/worker/...`), artifacts (`artifacts/`, `metrics/`) and templates
(`<kind>`, `*`) are not checked, nor, in the one test that creates it, a package a test creates. Runs in well under a second.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = (".py", ".md", ".yaml", ".yml", ".toml", ".cfg")
TEXT_NAMES = ("Makefile", "run")  # `.ci/run`
SKIPPED_DIRS = ("requirements/",)  # lock files: package names and versions only
PACKAGES = ("data_prep", "pipeline", "train", "export", "serve_eval", "tests")
PARAMS_SECTIONS_NAMED_LIKE_PACKAGES = ("train", "export")  # `train.ar`, `export.kinds` are params keys
FILE_EXTENSIONS = ("py", "md", "yaml", "yml", "toml", "json", "txt", "cfg", "sh")
# A backticked bare Python file name must be a file of the repository (outside tests/, which name the
# files they create), except these files of other projects.
EXTERNAL_FILE_NAMES = {"llama_eagle3.py", "qwen3_dflash.py", "qwen3_dspark.py", "gpu_model_runner.py",
                       "convert_hf_to_gguf.py"}  # llama.cpp's converter, extracted into .venv-llamacpp
# Packages a test creates in a copy of the repository, by the test file that creates and names them.
CREATED_BY_TESTS = {"tests/pipeline/drafters/test_fourth_kind.py": "pipeline/drafters/ar2"}

BANNED = (
    (re.compile(r"DESIGN\.md|DESIGN\s+section"), "cites the design reference outside the repository (use docs/algorithms.md)"),
    (re.compile(r"\b(?:pre-)?issues?[- ]#?\d+", re.IGNORECASE), "cites an issue number (say what it is instead)"),
    (re.compile(r"\bPR ?#?\d+\b|\bpull request #?\d+", re.IGNORECASE), "cites a pull request number"),
    (re.compile(r"(?<![\w&/#])#\d{1,5}(?!\w)"), "cites a tracker number (#N)"),
)
BACKTICKED = re.compile(r"`([^`\s]+)`")
PLAIN_PATH = re.compile(
    rf"(?<![\w./-])((?:{'|'.join(PACKAGES)}|docs)/[\w./-]*\.(?:{'|'.join(FILE_EXTENSIONS)}))(?![\w/])")
MODULE = re.compile(rf"(?<![\w./-])((?:{'|'.join(PACKAGES)})(?:\.[A-Za-z_]\w*)+)")
DOC_ANCHOR = re.compile(r"(?<![\w/])(docs/[\w./-]+\.md)#([\w-]+)")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
NOT_A_PATH = re.compile(r"[*<>{}$~|\\\"']|\.\.\.|://")


def repository_files() -> list[str]:
    """Tracked and new (not ignored) files, as git lists them; skips outside a git work tree."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                                cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git work tree: cannot tell repository files from build outputs")
    return sorted({name for name in listed.split("\0") if name and (ROOT / name).is_file()})


class Tree:
    """The repository's paths, for existence checks."""

    def __init__(self, files: list[str]):
        self.files = set(files)
        self.dirs = {str(parent) for name in files for parent in Path(name).parents if str(parent) != "."}
        self.top = {name.split("/")[0] for name in self.files | self.dirs}
        self.dir_names = {Path(d).name for d in self.dirs}
        self.file_names = {Path(f).name for f in self.files}
        self.texts: dict[str, str] = {}

    def text(self, name: str) -> str:
        if name not in self.texts:
            self.texts[name] = (ROOT / name).read_text(encoding="utf-8", errors="replace")
        return self.texts[name]

    def exists(self, path: str) -> bool:
        return path in self.files or path in self.dirs

    def is_suffix(self, path: str) -> bool:
        return any(name == path or name.endswith("/" + path) for name in self.files | self.dirs)

    def anchors(self, page: str) -> set[str]:
        return anchors_in(self.text(page))

    def module_defines(self, module_file: str, name: str) -> bool:
        pattern = (rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b|^\s*{name}\s*[:=]"
                   rf"|^\s*(?:from|import)\s.*\b{name}\b|^\s+{name},?\s*$")
        return re.search(pattern, self.text(module_file), re.MULTILINE) is not None


def anchors_in(markdown: str) -> set[str]:
    """Explicit `<a id=...>` anchors and GitHub's heading slugs."""
    ids = set(re.findall(r"""<a\s+(?:id|name)=["']([^"']+)["']""", markdown))
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", markdown, re.MULTILINE):
        ids.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return ids


def _clean(token: str) -> str:
    token = re.sub(r":\d+(?:-\d+)?$", "", token)  # file.py:12
    return token.rstrip(".,;:)")


def path_problem(token: str, tree: Tree, backticked: bool, in_tests: bool = False) -> str | None:
    token = _clean(token)
    if NOT_A_PATH.search(token) or token.startswith("/"):
        return None
    if "/" not in token:
        known = tree.file_names | EXTERNAL_FILE_NAMES
        if backticked and not in_tests and re.fullmatch(r"[\w.-]+\.py", token) and token not in known:
            return f"names `{token}`, which is no file of the repository"
        return None
    path = token.split("#", 1)[0].rstrip("/")
    first = path.split("/", 1)[0]
    has_extension = re.search(rf"\.(?:{'|'.join(FILE_EXTENSIONS)})$", path) is not None
    if first in tree.top:
        if backticked or has_extension:
            return None if tree.exists(path) else f"names `{token}`, which the repository does not hold"
        return None
    if backticked and has_extension and first in tree.dir_names and not tree.is_suffix(path):
        return f"names `{token}`, which matches no path in the repository"
    return None


def module_problem(dotted: str, tree: Tree) -> str | None:
    """A dotted name under one of the packages must be a module, or an attribute its module defines."""
    parts = dotted.split(".")
    for length in range(len(parts), 0, -1):
        base = "/".join(parts[:length])
        module = next((f for f in (f"{base}.py", f"{base}/__init__.py") if f in tree.files), None)
        if module is None:
            continue
        if length == len(parts) or tree.module_defines(module, parts[length]):
            return None
        if length == 1 and parts[0] in PARAMS_SECTIONS_NAMED_LIKE_PACKAGES:
            return None  # `train.ar.trainer`, `export.kinds`: params keys, not modules
        return f"names `{dotted}`, but `{'.'.join(parts[:length])}` has no `{parts[length]}`"
    return None


def created_by(name: str, token: str) -> bool:
    """Whether `token` (a path or a dotted module) is in the package test file `name` creates."""
    package = CREATED_BY_TESTS.get(name)
    path = _clean(token).replace(".", "/") if "/" not in token else _clean(token)
    return package is not None and (path == package or path.startswith(package + "/"))


def find_stale(name: str, text: str, tree: Tree) -> list[str]:
    """Every stale pointer in one file's text, as `name:line: why`."""
    problems = []
    is_markdown = name.endswith(".md")
    for number, line in enumerate(text.splitlines(), start=1):
        found: list[str] = []
        found += [why for pattern, why in BANNED if pattern.search(line)]
        for token in BACKTICKED.findall(line):
            if created_by(name, token):
                continue
            found.append(path_problem(token, tree, backticked=True, in_tests=name.startswith("tests/")) or "")
        for token in PLAIN_PATH.findall(line):
            if created_by(name, token):
                continue
            found.append(path_problem(token, tree, backticked=False) or "")
        for dotted in MODULE.findall(line):
            if created_by(name, dotted):
                continue
            found.append(module_problem(dotted, tree) or "")
        for page, anchor in DOC_ANCHOR.findall(line):
            if page in tree.files and anchor not in tree.anchors(page):
                found.append(f"cites {page}#{anchor}, an anchor the page does not define")
        if is_markdown:
            for target in MD_LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue  # http(s), mailto
                page, _, anchor = target.partition("#")
                if not page:
                    if anchor not in anchors_in(text):
                        found.append(f"links to #{anchor}, an anchor this page does not define")
                    continue
                page = os.path.normpath(Path(name).parent / page)  # relative to the page, `..` resolved
                if not tree.exists(page):
                    found.append(f"links to {target}, which the repository does not hold")
                elif anchor and page in tree.files and page.endswith(".md") and anchor not in tree.anchors(page):
                    found.append(f"links to {target}, an anchor the page does not define")
        problems += [f"{name}:{number}: {why}" for why in dict.fromkeys(found) if why]
    return problems


def is_text_file(name: str) -> bool:
    return not name.startswith(SKIPPED_DIRS) and (name.endswith(TEXT_SUFFIXES) or Path(name).name in TEXT_NAMES)


@functools.cache
def repository_tree() -> Tree:
    return Tree(repository_files())


def test_no_comment_or_doc_points_at_what_the_repository_lacks():
    tree = repository_tree()
    problems = [problem for name in sorted(tree.files) if is_text_file(name)
                for problem in find_stale(name, tree.text(name), tree)]
    assert not problems, "stale pointers:\n" + "\n".join(problems)


def test_the_design_document_is_in_the_repository_and_linked_from_the_readme():
    tree = repository_tree()
    assert "docs/algorithms.md" in tree.files
    assert "docs/algorithms.md" in tree.text("README.md")


# Planted cases, run through the same function on made-up file contents. The strings are built from
# pieces so this file itself holds none of them.
PLANTED = {
    "design file": "# see DESIGN" + ".md for why",
    "design section": "# the gate (DESIGN " + "section 9)",
    "issue number": '"""Ablation of the choices (issue' + ' 11)."""',
    "issue slug": "run the benchmark vs the pre-issue" + "-15 setup",
    "tracker number": "does not hit Lightning #" + "17319",
    "missing backticked path": "the schema in `pipeline/" + "config.py`",
    "missing relative path": "`block/" + "nothing.py` lists the keys",
    "missing file name": "`served" + ".py` checks every served layout",
    "missing plain path": "# see train/" + "nowhere_module.py for the loop",
    "moved module": "`serve_eval." + "verification.Sampling` draws the samples",
    "moved attribute": "the layout in `pipeline.paths." + "ArtifactPath`",
    "missing doc anchor": "# docs/algorithms.md" + "#no-such-section",
    "missing markdown link": "[design](docs/" + "nothing.md)",
    "missing markdown anchor": "[up](#no" + "where)",
}


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_a_planted_stale_pointer_is_caught(case):
    tree = repository_tree()
    suffix = ".md" if "markdown" in case else ".py"
    assert find_stale(f"planted{suffix}", PLANTED[case] + "\n", tree), f"not caught: {PLANTED[case]!r}"


def test_live_pointers_pass():
    tree = repository_tree()
    fine = "\n".join([
        "# docs/algorithms.md#promotion-gate; see `tests/test_no_stale_pointers.py` and `block/model.py`",
        "`tests.test_no_stale_pointers.find_stale`, `train.ar.trainer.strategy`, `export.kinds`, `artifacts/verifier/`",
        "vLLM's `v1/worker/gpu_model_runner.py`, https://github.com/Lightning-AI/pytorch-lightning/issues/17319",
        "colour #1f77b4, `pipeline/drafters/<kind>/config.py`, `llama_eagle3.py`, tests/test_no_stale_pointers.py",
        "## Top",
        "[the design](docs/algorithms.md#speculative-decoding), [up](#top)",
    ])
    assert find_stale("fine.md", fine, tree) == []


def test_a_package_a_test_creates_is_named_only_in_that_test():
    tree = repository_tree()
    (creator, package), = CREATED_BY_TESTS.items()
    lines = f"`{package}/kind.py` and `{package.replace('/', '.')}.spec`, also {package}/training.py\n"
    assert find_stale(creator, lines, tree) == []
    assert len(find_stale("planted.py", lines, tree)) == 3
