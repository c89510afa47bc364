"""The parts of a Responses body: input items, content parts, tools, tool choices, formats.

Input items come back from clients as they were answered (often by another server), so
an item's fields Conveyor does not read are ignored; the request body's own fields are
checked strictly (``schemas``). Items and tools Conveyor cannot act on are refused by
name: images, files and audio in content, hosted tools (``web_search``, ``file_search``,
``code_interpreter``, ``computer_use``, ``image_generation``, ``mcp``...) and their calls.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictStr,
    Tag,
    model_validator,
)

from conveyor.endpoints.validation import FastList

__all__ = [
    "AllowedTools",
    "ContentPart",
    "FunctionCallItem",
    "FunctionCallOutputItem",
    "FunctionChoice",
    "FunctionToolSpec",
    "InputItem",
    "MessageItem",
    "ReasoningItem",
    "TextConfig",
    "TextFormat",
    "ToolChoiceSpec",
    "check_item_types",
    "check_tool_choice",
    "check_tool_types",
]

NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
TEXT_PART_TYPES = ("input_text", "output_text", "text", "refusal")
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")


class _Item(BaseModel):
    """Base of an input item: fields Conveyor does not read are ignored."""

    model_config = ConfigDict(extra="ignore")


class _Strict(BaseModel):
    """Base of a request part: unknown fields are errors."""

    model_config = ConfigDict(extra="forbid")


class ContentPart(_Item):
    """One text part of a message: ``input_text``, ``output_text`` or ``refusal``."""

    type: StrictStr
    text: StrictStr | None = None
    refusal: StrictStr | None = None

    @model_validator(mode="after")
    def _text_only(self) -> ContentPart:
        if self.type not in TEXT_PART_TYPES:
            raise ValueError(
                f"content parts of type {self.type!r} are not supported; use 'input_text'"
            )
        if self.type != "refusal" and self.text is None:
            raise ValueError(f"a {self.type} content part needs 'text'")
        return self

    @property
    def plain(self) -> str:
        """The part's text (a refusal's reason)."""
        return (self.refusal if self.type == "refusal" else self.text) or ""


class MessageItem(_Item):
    """A message: the user's, an earlier assistant reply, or system / developer text."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: StrictStr | FastList[ContentPart]
    id: StrictStr | None = None

    @property
    def text(self) -> str:
        """The content as one string."""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.plain for part in self.content)


class FunctionCallItem(_Item):
    """An earlier call the model made to one of the functions."""

    type: Literal["function_call"]
    call_id: StrictStr = Field(min_length=1)
    name: StrictStr = Field(min_length=1)
    arguments: StrictStr
    id: StrictStr | None = None


class FunctionCallOutputItem(_Item):
    """What the client's function returned for the call ``call_id``."""

    type: Literal["function_call_output"]
    call_id: StrictStr = Field(min_length=1)
    output: StrictStr | FastList[ContentPart]
    id: StrictStr | None = None

    @property
    def text(self) -> str:
        """The output as one string."""
        if isinstance(self.output, str):
            return self.output
        return "".join(part.plain for part in self.output)


class ReasoningItem(_Item):
    """Another model's reasoning, handed back: accepted and not shown to the model."""

    type: Literal["reasoning"]
    id: StrictStr | None = None


def _item_type(value: Any) -> str:
    """The item's ``type`` (a message may leave it out)."""
    if isinstance(value, dict):
        return str(value.get("type") or "message")
    return str(getattr(value, "type", "message"))


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_type),
]


def check_item_types(value: Any) -> Any:
    """400 naming the first item Conveyor cannot take (before pydantic's own pass)."""
    if not isinstance(value, list):
        return value
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise ValueError(f"input[{index}] must be an object")
        kind = item.get("type") or "message"
        if kind == "item_reference":
            raise ValueError(
                f"input[{index}]: item references are not supported; send the item itself "
                "or continue with previous_response_id"
            )
        if kind not in ITEM_TYPES:
            raise ValueError(
                f"input[{index}]: items of type {kind!r} are not supported (Conveyor runs no "
                "hosted tools); use messages, function_call and function_call_output items"
            )
    return value


class FunctionToolSpec(_Item):
    """A function the model may call (the only kind of tool Conveyor runs)."""

    type: Literal["function"]
    name: StrictStr = Field(pattern=NAME_PATTERN)
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


def check_tool_types(value: Any) -> Any:
    """400 naming the first hosted tool: Conveyor runs only the caller's functions."""
    if not isinstance(value, list):
        return value
    for index, tool in enumerate(value):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise ValueError(
                f"tools[{index}]: the hosted tool {kind!r} is not supported; Conveyor runs "
                "no hosted tools (web_search, file_search, code_interpreter, computer_use, "
                "image_generation, mcp, ...): declare a 'function' tool and run it yourself"
            )
    return value


class FunctionChoice(_Strict):
    """``{"type": "function", "name": ...}``: force a call to that function."""

    type: Literal["function"]
    name: StrictStr


class AllowedTools(_Strict):
    """``allowed_tools``: only these functions, called as ``mode`` says."""

    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: FastList[dict[str, Any]] = Field(min_length=1)

    @property
    def names(self) -> tuple[str, ...]:
        """The allowed functions' names."""
        return tuple(str(tool.get("name")) for tool in self.tools)


ToolChoiceSpec = Literal["none", "auto", "required"] | FunctionChoice | AllowedTools


def check_tool_choice(value: Any) -> Any:
    """400 naming a hosted tool choice (before pydantic tries each shape)."""
    if isinstance(value, dict) and value.get("type") not in ("function", "allowed_tools"):
        raise ValueError(
            f"tool_choice of type {value.get('type')!r} is not supported; use 'none', 'auto', "
            "'required', a function or allowed_tools"
        )
    if isinstance(value, dict) and value.get("type") == "allowed_tools":
        for tool in value.get("tools") or []:
            if not isinstance(tool, dict) or tool.get("type") != "function":
                raise ValueError("allowed_tools may only list functions")
    return value


class TextFormat(_Strict):
    """``text.format``: ``text``, ``json_object`` or a ``json_schema`` (Structured Outputs)."""

    type: Literal["text", "json_object", "json_schema"]
    name: StrictStr | None = Field(default=None, pattern=NAME_PATTERN)
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: StrictStr | None = None
    strict: StrictBool | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> TextFormat:
        if self.type == "json_schema" and (self.schema_ is None or self.name is None):
            raise ValueError("a json_schema format needs 'name' and 'schema'")
        return self

    def echo(self) -> dict[str, Any]:
        """The format as a response shows it."""
        return self.model_dump(by_alias=True, exclude_none=True)


class TextConfig(_Strict):
    """``text``: the output format; ``verbosity`` is accepted and ignored."""

    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
