"""The JSON schema of a forced tool call: the function's name and its ``parameters``.

A function's ``parameters`` is a schema document of its own: a ``$ref`` in it such as
``"#"`` or ``"#/$defs/Node"`` points into that document. Set inside the call's wrapper
as is, those pointers would resolve against the wrapper instead (``"#"`` would mean "a
whole call", not "these arguments"). So each function's parameters go under the
wrapper's ``$defs`` and their JSON-pointer refs are re-rooted there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conveyor.endpoints.chat_schemas import FunctionTool

NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


def reroot_refs(schema: Any, root: str) -> Any:
    """A copy of ``schema`` whose JSON-pointer refs (``#`` and ``#/...``) start at ``root``.

    Plain-name fragments (``#anchor``) and refs to other documents are kept as written.
    """
    if isinstance(schema, list):
        return [reroot_refs(item, root) for item in schema]
    if not isinstance(schema, dict):
        return schema
    copied = {key: reroot_refs(value, root) for key, value in schema.items()}
    ref = schema.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
        copied["$ref"] = root + ref[1:]
    return copied


def calls_schema(tools: Sequence[FunctionTool]) -> dict[str, Any]:
    """Schema of one call's JSON to any of ``tools`` (one tool: a call to it)."""
    definitions: dict[str, Any] = {}
    calls = []
    for index, tool in enumerate(tools):
        name = f"arguments_{index}"
        parameters = tool.function.parameters or NO_ARGUMENTS
        definitions[name] = reroot_refs(parameters, f"#/$defs/{name}")
        calls.append(
            {
                "type": "object",
                "properties": {
                    "name": {"const": tool.function.name},
                    "arguments": {"$ref": f"#/$defs/{name}"},
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    body: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return {"$defs": definitions, **body}
