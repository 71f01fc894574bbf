"""params.yaml -> a stage's typed params: YAML without duplicate keys, unknown top-level sections refused,
the sections the stage's schema holds validated, errors as one line naming the key."""

from __future__ import annotations

import reprlib
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import ValidationError

from pipeline.config.base import DEFAULT_PARAMS_PATH, SECTION_NAMES
from pipeline.config.stage_params import StageParams
from pipeline.errors import ParamsError

Schema = TypeVar("Schema", bound=StageParams)


# The offending value, shortened: YAML aliases can make a value of millions of nested items (25 MB of repr).
_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = 160
_SHORT_REPR.maxlist = _SHORT_REPR.maxdict = 6
_SHORT_REPR.maxlevel = 2


def _format_error(source: str, error: ValidationError) -> str:
    first = error.errors()[0]
    location = "".join(f"{part}: " for part in [".".join(str(part) for part in first["loc"])] if part)
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = "unknown key (remove it or check the spelling)"
    elif "input" in first and first["type"] not in ("missing",) and not isinstance(first["input"], dict):
        message = f"{message} (got {_SHORT_REPR.repr(first['input'])})"
    more = f" (+{error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return f"{source}: {location}{message}{more}"



def _nul_key_path(value: object, at: tuple[str, ...] = (), seen: set[int] | None = None) -> str | None:
    """The key path of the first string holding a NUL byte: no path, URL or name can, and the OS calls that
    would first trip on it raise deep inside a stage. YAML aliases share objects: each is walked once."""
    seen = set() if seen is None else seen
    if isinstance(value, str):
        return ".".join(at) or "(top level)" if "\0" in value else None
    if isinstance(value, (dict, list)):
        if id(value) in seen:
            return None
        seen.add(id(value))
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            found = _nul_key_path(item, (*at, str(key)), seen)
            if found:
                return found
    return None


def parse_params(data: object, schema: type[Schema], source: str = "params") -> Schema:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ParamsError(f"{source}: expected a mapping of sections at the top level, got {type(data).__name__}")
    nul = _nul_key_path(data)
    if nul:
        raise ParamsError(f"{source}: {nul}: contains a NUL byte; remove it")
    for name in data:
        if name not in SECTION_NAMES:
            raise ParamsError(f"{source}: {name}: unknown section (remove it or check the spelling; "
                              f"sections: {', '.join(SECTION_NAMES)})")
    try:
        return schema.model_validate({name: value for name, value in data.items() if name in schema.model_fields})
    except ValidationError as error:
        raise ParamsError(_format_error(source, error)) from None
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys; in params that hides which value is in effect. Merge keys
    (`<<: *anchor`) are left to SafeLoader: a key written next to one overrides the merged value, as YAML says."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key '{key}' (keep one)", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_params(schema: type[Schema], path: str | Path = DEFAULT_PARAMS_PATH) -> Schema:
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path}: file not found (run from the project root or pass --params PATH)")
    if not path.is_file():
        raise ParamsError(f"{path}: not a file (pass --params with the path of a params.yaml)")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except UnicodeDecodeError as error:
        raise ParamsError(f"{path}: not UTF-8 text (byte {error.start}); save it as UTF-8") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ParamsError(f"{path}: not valid YAML{where}: {getattr(error, 'problem', error)}") from None
    return parse_params(data, schema, str(path))
