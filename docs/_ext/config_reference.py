"""The configuration reference, written from the pydantic models that validate the file.

``render(ServerConfig)`` walks the models from the top level down: one table per section
of the YAML (key, type, default, description), sections in the order the file nests
them, each model once. A field without a description, or a section without a docstring,
is reported as a problem (the docs build fails on it), so the page cannot fall behind.
"""

from __future__ import annotations

import inspect
import json
import re
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from docs._ext.page import Page
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

MIB = 1024 * 1024
_BOUNDS = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"))
_NAMES: dict[Any, str] = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    Path: "path",
    SecretStr: "secret string",
}
INTRO = (
    "Every key the configuration file accepts, written from the pydantic models that "
    "validate it (`src/conveyor/config/` and the sections it embeds) each time the "
    "documentation is built. Unknown keys are errors. How the file, the environment and "
    "the flags combine is in [Configuration](index.md)."
)


@dataclass(frozen=True)
class Section:
    """One table of the page: a model and where it sits in the YAML."""

    model: type[BaseModel]
    path: str  # "jobs", "models[]", "tenants[].limits.<name>"; "" at the top level
    tag: str | None  # the union member it belongs to: "kind: generate"
    label: str  # how links to it read: the tag's value for a union member, else its path

    @property
    def anchor(self) -> str:
        """A stable target for links: ``config-`` and the path (and tag) as a slug."""
        slug = re.sub(r"[^a-z0-9]+", "-", f"{self.path} {self.tag or ''}".lower()).strip("-")
        return "config-" + (slug or "top-level")

    @property
    def title(self) -> str:
        """The heading: the YAML path in code, the union member it applies to."""
        if not self.path:
            return "Top level"
        return f"`{self.path}`" + (f" (`{self.tag}`)" if self.tag else "")


def render(root: type[BaseModel], env_vars: Mapping[str, str] | None = None) -> Page:
    """The reference page of ``root`` (the whole file); ``env_vars`` by top-level key."""
    sections = list(_sections(root))
    by_model = {section.model: section for section in sections}
    page = Page()
    lines = ["# Configuration reference", "", INTRO, ""]
    for section in sections:
        own_env = (env_vars or {}) if section.model is root else {}
        lines += _section(section, by_model, own_env, page)
    page.text = "\n".join(lines)
    return page


def _sections(root: type[BaseModel]) -> Iterator[Section]:
    """Every model reachable from ``root``, depth first in field order, each once."""
    seen: set[type[BaseModel]] = set()

    def visit(model: type[BaseModel], path: str, tag: str | None, label: str) -> Iterator[Section]:
        if model in seen:
            return
        seen.add(model)
        yield Section(model, path, tag, label)
        for name, info in model.model_fields.items():
            key = info.discriminator if isinstance(info.discriminator, str) else "kind"
            for suffix, nested, value in _nested_models(info.annotation, key):
                nested_path = (f"{path}.{name}" if path else name) + suffix
                own_tag = f"{key}: {value}" if value is not None else tag
                yield from visit(nested, nested_path, own_tag, value or nested_path)

    yield from visit(root, "", None, "top level")


def _nested_models(annotation: Any, key: str) -> Iterator[tuple[str, type[BaseModel], str | None]]:
    """The models a field holds: what each adds to the YAML path (``[]``, ``.<name>``) and,
    for a member of a union of models, the value of ``key`` that selects it."""
    origin, args = get_origin(annotation), get_args(annotation)
    if _is_model(annotation):
        yield "", annotation, None
    elif origin is Annotated:
        for item in args[1:]:  # Field(discriminator=...) inside Annotated
            found = getattr(item, "discriminator", None)
            key = found if isinstance(found, str) else key
        yield from _nested_models(args[0], key)
    elif origin is list:
        yield from (("[]" + s, m, v) for s, m, v in _nested_models(args[0], key))
    elif origin is dict:
        yield from ((".<name>" + s, m, v) for s, m, v in _nested_models(args[1], key))
    elif origin in (Union, types.UnionType):
        is_tagged = sum(_is_model(arg) for arg in args) > 1
        for arg in args:
            for suffix, model, value in _nested_models(arg, key):
                yield suffix, model, _tag(model, key) if is_tagged and model is arg else value


def _section(
    section: Section,
    by_model: Mapping[type[BaseModel], Section],
    env_vars: Mapping[str, str],
    page: Page,
) -> list[str]:
    """The heading, the model's docstring and the table of one section."""
    own_doc = vars(section.model).get("__doc__")  # its own, not one inherited
    doc = inspect.cleandoc(own_doc) if own_doc else None
    if not doc:
        page.problems.append(f"config section {section.label} has no docstring")
    lines = [f"({section.anchor})=", f"## {section.title}", "", *([doc, ""] if doc else [])]
    lines += ["| key | type | default | description |", "| --- | --- | --- | --- |"]
    for name, info in section.model.model_fields.items():
        description = " ".join((info.description or "").split())
        if not description:
            where = f"{section.path}.{name}" if section.path else name
            page.problems.append(f"config field {where} has no description")
        if name in env_vars:
            description += f" Environment: `{env_vars[name]}`."
        kind = _type(info.annotation, by_model) + _bounds(info)
        cells = [f"`{name}`", kind, _default(info, by_model), description]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return [*lines, ""]


def _type(annotation: Any, by_model: Mapping[type[BaseModel], Section]) -> str:
    """A field's type in words; nested sections as links."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _type(args[0], by_model)
    if origin in (Union, types.UnionType):
        kept = [arg for arg in args if arg is not type(None)]
        text = " or ".join(_type(arg, by_model) for arg in kept)
        return text + " or null" if len(kept) < len(args) else text
    if origin is Literal:
        return " or ".join(f"`{json.dumps(value)}`" for value in args)
    if origin is list:
        return "list of " + _type(args[0], by_model)
    if origin is dict:
        return f"mapping of {_type(args[0], by_model)} to {_type(args[1], by_model)}"
    if _is_model(annotation):
        target = by_model[annotation]
        return f"[`{target.label}`](#{target.anchor})"
    return _NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _bounds(info: FieldInfo) -> str:
    """The field's constraints: bounds, a shortest length, a pattern."""
    found = []
    for item in info.metadata:
        found += [f"{sign} {getattr(item, name)}" for name, sign in _BOUNDS if hasattr(item, name)]
        if getattr(item, "min_length", None) is not None:
            found.append(f"at least {item.min_length} characters")
        if getattr(item, "pattern", None) is not None:
            found.append(f"matching `{item.pattern}`")
    return ", " + ", ".join(found) if found else ""


def _default(info: FieldInfo, by_model: Mapping[type[BaseModel], Section]) -> str:
    """The default as YAML spells it, or *required*."""
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined:
        return "*required*"
    else:
        value = info.default
    if isinstance(value, BaseModel):
        return f"[its defaults](#{by_model[type(value)].anchor})"
    if isinstance(value, Path):
        return f"`{value}`"
    text = f"`{json.dumps(value)}`"
    if isinstance(value, int) and not isinstance(value, bool) and value >= MIB and not value % MIB:
        text += f" ({value // MIB} MiB)"
    return text


def _tag(model: type[BaseModel], key: str) -> str | None:
    """The literal value of ``key`` that selects ``model`` in a union, if it has one."""
    info = model.model_fields.get(key)
    values = get_args(info.annotation) if info is not None else ()
    return str(values[0]) if len(values) == 1 else None


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)
