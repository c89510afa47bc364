"""A forced call's schema: each function's parameters keep their own meaning of ``$ref``."""

from __future__ import annotations

from typing import Any

import jsonschema_rs

from conveyor.endpoints.chat_schemas import FunctionTool
from conveyor.endpoints.tool_schema import calls_schema, reroot_refs

TREE = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "children": {"type": "array", "items": {"$ref": "#"}},
        "colour": {"$ref": "#/$defs/Colour"},
    },
    "required": ["name"],
    "additionalProperties": False,
    "$defs": {"Colour": {"enum": ["red", "green"]}},
}


def tool(name: str, parameters: dict[str, Any] | None) -> FunctionTool:
    function: dict[str, Any] = {"name": name}
    if parameters is not None:
        function["parameters"] = parameters
    return FunctionTool.model_validate({"type": "function", "function": function})


def test_a_recursive_parameters_schema_refers_to_its_own_root() -> None:
    validator = jsonschema_rs.validator_for(calls_schema([tool("plant", TREE)]))
    nested = {"name": "a", "colour": "red", "children": [{"name": "b", "children": []}]}
    assert validator.is_valid({"name": "plant", "arguments": nested})
    # "#" is the arguments' root, not the call's: a child shaped like a call is wrong.
    wrong = {"name": "a", "children": [{"name": "plant", "arguments": {"name": "x"}}]}
    assert not validator.is_valid({"name": "plant", "arguments": wrong})
    assert not validator.is_valid({"name": "plant", "arguments": {"name": "a", "colour": "blue"}})


def test_several_tools_each_keep_their_own_definitions() -> None:
    other = {"type": "object", "properties": {"n": {"$ref": "#/$defs/Colour"}},
             "$defs": {"Colour": {"type": "integer"}}}  # fmt: skip
    validator = jsonschema_rs.validator_for(
        calls_schema([tool("plant", TREE), tool("count", other), tool("clock", None)])
    )
    assert validator.is_valid({"name": "count", "arguments": {"n": 3}})
    assert not validator.is_valid({"name": "count", "arguments": {"n": "red"}})
    assert validator.is_valid({"name": "plant", "arguments": {"name": "a", "colour": "green"}})
    assert validator.is_valid({"name": "clock", "arguments": {}})
    assert not validator.is_valid({"name": "clock", "arguments": {"x": 1}})


def test_only_json_pointer_refs_are_rerooted() -> None:
    schema = {"a": {"$ref": "#"}, "b": [{"$ref": "#/x"}], "c": {"$ref": "#anchor"},
              "d": {"$ref": "other.json#/y"}}  # fmt: skip
    assert reroot_refs(schema, "#/$defs/p") == {
        "a": {"$ref": "#/$defs/p"}, "b": [{"$ref": "#/$defs/p/x"}],
        "c": {"$ref": "#anchor"}, "d": {"$ref": "other.json#/y"},
    }  # fmt: skip
