"""TOML input files (suites, sites, claims): one loader, and one error type whose message is a single line."""

from __future__ import annotations

import difflib
import re
import sys
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

Model = TypeVar("Model", bound=BaseModel)


class FileError(Exception):
    """An input file is invalid. The message is one line naming the file and the field."""



def field_path(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as the TOML path a user reads: ('run', 2, 'params', 'bits') -> run[2].params.bits."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<top level>"


#: A location part that names a member of a union type (pydantic's tag: 'int', 'list[int]', "literal['auto']",
#: 'function-after[...]', a model's class name), not a field.
_UNION_TAG = re.compile(r"^(int|float|str|bool|none|[a-z-]+\[.*\]|function-[a-z]+|[A-Z]\w*)$")


#: pydantic's error types for a value that is not a number or a bool (in strict mode: a string that looks like one).
_NUMBER_OR_BOOL = frozenset({"int_type", "float_type", "bool_type"})


def _field_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """`loc` without the union-member tags: ('threads_per_rank', 'list[int]', 0) -> ('threads_per_rank', 0)."""
    return tuple(x for x in loc if isinstance(x, int) or not _UNION_TAG.match(str(x)))


def _keys_at(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> list[str]:
    """The keys the model accepts where `loc` (minus its last part) points: the model's fields, or those of the
    model a field holds (directly, in a list, or as an optional); [] where that is not a model."""
    for part in loc[:-1]:
        if isinstance(part, int) or model is None:
            continue
        field = model.model_fields.get(part)
        if field is None:
            return []
        model = _model_in(field.annotation)
    return list(model.model_fields) if model is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def first_error(path: Path, err: ValidationError, prefix: str = "", model: type[BaseModel] | None = None
                ) -> FileError:
    """The first problem pydantic found, as one line: '<file>: <field>: <what is wrong>' (error_parts), the field
    under `prefix` where given."""
    field, msg = error_parts(err, model)
    if prefix:
        field = f"{prefix}.{field}" if field != "<top level>" else prefix
    return FileError(f"{path}: {field}: {msg}")


def error_parts(err: ValidationError, model: type[BaseModel] | None = None) -> tuple[str, str]:
    """The first problem pydantic found: (its field as a TOML path, what is wrong in one line). A value that fits no
    member of a union type is one problem: its field once, with what each member wanted. With `model` (what was
    validated), an unknown key names the nearest known one ('did you mean max_epochs?')."""
    errors = err.errors()
    e = errors[0]
    loc = _field_loc(e["loc"])
    field = field_path(loc)
    wanted = list(dict.fromkeys(x["msg"] for x in errors if _field_loc(x["loc"]) == loc and x["type"] != "missing"))
    msg = e["msg"]
    if len(wanted) > 1:  # 'Input should be a valid integer or a valid list'
        msg = " or ".join([wanted[0], *(w.removeprefix("Input should be ") for w in wanted[1:])])
    if e["type"] == "extra_forbidden":
        msg = "unknown key"
        close = difflib.get_close_matches(str(loc[-1]), _keys_at(model, loc), n=1, cutoff=0.8) if loc else []
        if close:
            msg += f" (did you mean {close[0]}?)"
    elif e["type"] == "missing":
        msg = "required key is missing"
    elif "input" in e and e["type"] not in ("value_error",):
        msg = f"{msg} (got {e['input']!r})"
        if isinstance(e["input"], str) and e["type"] in _NUMBER_OR_BOOL and _unquoted(e["input"], e["type"]):
            # TOML's "2" is a string, 2 a number: advice only where the text is the value in quotes
            msg += ": write true or false, without quotes" if e["type"] == "bool_type" else ": write it without quotes"
    return field, msg


def _unquoted(text: str, kind: str) -> bool:
    """Whether quoting is what went wrong: always for a bool (true or false, unquoted, is the only way to write
    one), for a number only when the text is one ('2', '0.05'; not 'fast')."""
    if kind == "bool_type":
        return True  # true or false is the only way to write one
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_toml(path: str | Path, what: str = "file") -> dict[str, Any]:
    """The TOML document at `path` as a dict. Raises FileError (one line) when it cannot be read or parsed."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise FileError(f"{path}: cannot read {what}: {reason}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise FileError(f"{path}: not valid TOML: {exc}") from None


def load_toml(path: str | Path, model: type[Model], what: str = "file") -> tuple[Model, dict[str, Any]]:
    """Read `path` and validate it as `model`; returns the model and the raw document. Raises FileError (one line)."""
    doc = read_toml(path, what)
    try:
        return model.model_validate(doc), doc
    except ValidationError as exc:
        raise first_error(Path(path), exc, model=model) from None
