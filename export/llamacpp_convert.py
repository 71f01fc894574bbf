"""llama.cpp's own `convert_hf_to_gguf.py`, run inside `.venv-llamacpp` (`python -I`: no draftline on the path).

    python -I export/llamacpp_convert.py JOB.json

JOB: {"tree": the converter's llama.cpp tree (`make serve-env` extracts it to `.venv-llamacpp/llama.cpp`),
"target_dir": the verifier (the drafter converters take its tokenizer and config from it; the others
ignore it), "pre_tokenizer": a name or null, "conversions": [{"model_dir", "outfile", "outtype"}, ...]}.
All conversions run in this one process (the converter's imports take most of a small model's time).

The converter reads a BPE tokenizer's pre-tokenizer (the regex that splits text before BPE) from a table
of known tokenizers' hashes. For a tokenizer missing from that table: `pre_tokenizer` names it; without
it, a plain byte-level BPE (HF `ByteLevel` with its regex and no prefix space, as the demo's own) is
GPT-2's regex exactly, so it is stored as `gpt-2`; any other exits with code 3, and a name the converter
does not know with code 4, each after one line saying so.
"""

from __future__ import annotations

import json
import re
import runpy
import sys
from pathlib import Path

UNKNOWN_TOKENIZER = 3
UNKNOWN_NAME = 4
GPT2 = "gpt-2"


def known_pre_tokenizers(tree: Path) -> list[str]:
    """The names the converter's hash table can produce: the ones llama.cpp's runtime knows."""
    source = (tree / "conversion" / "base.py").read_text(encoding="utf-8")
    return sorted(set(re.findall(r'^\s+res = "([^"]+)"', source, flags=re.MULTILINE)))


def gpt2_byte_level(model_dir: Path) -> bool:
    """HF's `ByteLevel` pre-tokenizer, regex on and no prefix space: it splits text with GPT-2's regex."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return False
    pre = json.loads(path.read_text(encoding="utf-8")).get("pre_tokenizer") or {}
    return pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space", False)


def use_pre_tokenizer(base, tree: Path, name: str | None) -> int:
    """Where the converter's table does not know the tokenizer: `name`, else gpt-2 for a plain byte-level BPE,
    else one line and exit code 3. A `name` the converter does not know: one line, returns 4."""
    if name and name not in known_pre_tokenizers(tree):
        print(f"'{name}' is not a pre-tokenizer of llama.cpp's converter; known: {', '.join(known_pre_tokenizers(tree))}")
        return UNKNOWN_NAME
    original = base.TextModel.get_vocab_base_pre

    def recognised(self, tokenizer) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            fallback = name or (GPT2 if gpt2_byte_level(Path(self.dir_model)) else None)
            if fallback:
                print(f"pre-tokenizer: not in the converter's table, stored as {fallback}", flush=True)
                return fallback
            print("llama.cpp's converter does not know the verifier tokenizer's pre-tokenizer (its hash is not "
                  "in conversion/base.py get_vocab_base_pre)", flush=True)
            raise SystemExit(UNKNOWN_TOKENIZER) from None

    base.TextModel.get_vocab_base_pre = recognised
    return 0


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    tree = Path(job["tree"]).resolve()
    sys.path[:0] = [str(tree), str(tree / "gguf-py")]
    import conversion.base as base

    status = use_pre_tokenizer(base, tree, job["pre_tokenizer"])
    if status:
        return status
    script = tree / "convert_hf_to_gguf.py"
    convert = runpy.run_path(str(script), run_name="llamacpp_convert")["main"]  # defined, not run
    for item in job["conversions"]:
        sys.argv = [str(script), item["model_dir"], "--outfile", item["outfile"], "--outtype", item["outtype"],
                    "--target-model-dir", job["target_dir"]]
        convert()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
