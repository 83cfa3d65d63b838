"""OpenAI tool schemas from Python functions: signature type hints + Google-style docstring.

The same rules as transformers' `get_json_schema` (what chat templates are given), without
importing transformers: the base package evaluates tool environments with no trainer installed.
`tests/unit/test_tool_schema.py` holds both to the same output.
"""

from __future__ import annotations

import inspect
import json
import re
import types
from collections.abc import Callable
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

DESCRIPTION = re.compile(r"^(.*?)[\n\s]*(Args:|Returns:|Raises:|\Z)", re.DOTALL)
ARGS = re.compile(r"\n\s*Args:\n\s*(.*?)[\n\s]*(Returns:|Raises:|\Z)", re.DOTALL)
ARG = re.compile(r"(?:^|\n)\s*(\w+):\s*(.*?)\s*(?=\n\s*\w+:|\Z)", re.DOTALL)
RETURNS = re.compile(r"\n\s*Returns:\n\s*(.*?)[\n\s]*(Raises:|\Z)", re.DOTALL)
CHOICES = re.compile(r"\(choices:\s*(.*?)\)\s*$", re.IGNORECASE)
BASIC = {
    int: {"type": "integer"},
    float: {"type": "number"},
    str: {"type": "string"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    list: {"type": "array"},
    tuple: {"type": "array"},
    dict: {"type": "object"},
    Any: {},
}


class ToolSchemaError(ValueError):
    """A tool function whose signature or docstring cannot become a schema."""


def _hint(hint: Any) -> dict[str, Any]:
    origin, args = get_origin(hint), get_args(hint)
    if origin is None:
        return dict(BASIC.get(hint, {"type": "object"}))
    if origin is Union or origin is types.UnionType:
        subtypes = [_hint(t) for t in args if t is not type(None)]
        if len(subtypes) == 1:
            out = subtypes[0]
        elif all(s.keys() == {"type"} and isinstance(s["type"], str) for s in subtypes):
            names = sorted({s["type"] for s in subtypes})
            out = {"type": names[0] if len(names) == 1 else names}
        else:
            out = {"anyOf": subtypes}
        if type(None) in args:
            out["nullable"] = True
        return out
    if origin is Literal and args:
        kinds: list[str] = []
        for arg in args:
            if type(arg) not in (int, float, str, bool, type(None)):
                raise ToolSchemaError("only plain literals can be listed in typing.Literal")
            kind = BASIC[type(arg)].get("type")
            if kind is not None and kind not in kinds:
                kinds.append(kind)
        return {"type": kinds.pop() if len(kinds) == 1 else kinds, "enum": list(args)}
    if origin is list:
        return {"type": "array", "items": _hint(args[0])} if args else {"type": "array"}
    if origin is tuple:
        if not args:
            return {"type": "array"}
        if len(args) == 1 or ... in args:
            raise ToolSchemaError(f"use list[...] instead of {hint}")
        return {"type": "array", "prefixItems": [_hint(t) for t in args]}
    if origin is dict:
        out = {"type": "object"}
        if len(args) == 2:
            out["additionalProperties"] = _hint(args[1])
        return out
    raise ToolSchemaError(f"cannot express the type hint {hint} as JSON schema")


def _parameters(func: Callable[..., Any]) -> dict[str, Any]:
    hints = get_type_hints(func)
    signature = inspect.signature(func)
    name = getattr(func, "__name__", "operation")
    first = next(iter(signature.parameters), None)
    implicit = (
        first
        if first in {"self", "cls"}
        and signature.parameters[first].annotation == inspect.Parameter.empty
        else None
    )
    required = []
    for param_name, param in signature.parameters.items():
        if param_name == implicit:
            continue
        if param.annotation == inspect.Parameter.empty:
            raise ToolSchemaError(f"argument {param_name} of {name} has no type hint")
        if param.default == inspect.Parameter.empty:
            required.append(param_name)
    properties = {k: _hint(v) for k, v in hints.items() if k != implicit}
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def get_json_schema(func: Callable[..., Any]) -> dict[str, Any]:
    """`{"type": "function", "function": {name, description, parameters[, return]}}`."""
    name = getattr(func, "__name__", "operation")
    doc = (inspect.getdoc(func) or "").strip()
    if not doc:
        raise ToolSchemaError(f"cannot build a tool schema for {name}: it has no docstring")
    description = DESCRIPTION.search(doc)
    args_block, returns = ARGS.search(doc), RETURNS.search(doc)
    described: dict[str, str] = {}
    if args_block is not None:
        lines = "\n".join(line for line in args_block.group(1).strip().split("\n") if line.strip())
        described = {m[0]: re.sub(r"\s*\n+\s*", " ", m[1].strip()) for m in ARG.findall(lines)}
    parameters = _parameters(func)
    returned = parameters["properties"].pop("return", None)
    if returned is not None and returns is not None:
        returned["description"] = returns.group(1).strip()
    for arg, schema in parameters["properties"].items():
        if arg not in described:
            raise ToolSchemaError(
                f"cannot build a tool schema for {name}: the docstring has no description for "
                f"the argument '{arg}'"
            )
        text = described[arg]
        choices = CHOICES.search(text)
        if choices:
            schema["enum"] = [
                c.strip() if isinstance(c, str) else c for c in json.loads(choices[1])
            ]
            text = text[: choices.start()].strip()
        schema["description"] = text
    function = {
        "name": name,
        "description": description.group(1).strip() if description else None,
        "parameters": parameters,
    }
    if returned is not None:
        function["return"] = returned
    return {"type": "function", "function": function}
