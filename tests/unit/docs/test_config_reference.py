"""The configuration reference page written from pydantic models (docs/_ext/config_reference)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from docs._ext.config_reference import render
from pydantic import BaseModel, Field

from conveyor.config.settings import ENV_VARS, ServerConfig


class Inner(BaseModel):
    """A nested section."""

    depth: int = Field(default=3, ge=1, le=9, description="How deep.")


class Cat(BaseModel):
    """A cat entry."""

    kind: Literal["cat"] = Field(description="Selects this entry.")
    lives: int = Field(default=9, description="Lives left.")


class Dog(BaseModel):
    """A dog entry."""

    kind: Literal["dog"] = Field(description="Selects this entry.")
    inner: Inner | None = Field(default=None, description="Under the dog.")


class Root(BaseModel):
    """The root."""

    name: str = Field(min_length=2, description="A name.")
    size: int = Field(default=16 * 1024 * 1024, description="Bytes.")
    path: Path = Field(default=Path("data"), description="Where.")
    inner: Inner = Field(default_factory=Inner, description="A section.")
    pets: list[Annotated[Cat | Dog, Field(discriminator="kind")]] = Field(
        default_factory=list, description="Pets by kind."
    )
    by_name: dict[str, Inner] = Field(default_factory=dict, description="Sections by name.")
    mode: Literal["a", "b"] | None = None


def _row(text: str, key: str, section: str) -> str:
    """The table row of ``key`` in the section whose anchor is ``section``."""
    body = text.split(f"({section})=", 1)[1].split("\n(", 1)[0]
    return next(line for line in body.splitlines() if line.startswith(f"| `{key}` |"))


def test_each_model_is_a_section_in_the_order_the_file_nests_them() -> None:
    text = render(Root).text
    anchors = re.findall(r"^\((config-[a-z0-9-]+)\)=$", text, flags=re.MULTILINE)
    assert anchors == ["config-top-level", "config-inner", "config-pets-kind-cat",
                       "config-pets-kind-dog"]  # fmt: skip
    assert "## `pets[]` (`kind: dog`)" in text
    assert "A dog entry." in text


def test_rows_say_type_bounds_default_and_description() -> None:
    text = render(Root, {"name": "ROOT_NAME"}).text
    assert _row(text, "name", "config-top-level") == (
        "| `name` | string, at least 2 characters | *required* | A name. "
        "Environment: `ROOT_NAME`. |"
    )
    assert "| `16777216` (16 MiB) |" in _row(text, "size", "config-top-level")
    assert "| path | `data` |" in _row(text, "path", "config-top-level")
    assert _row(text, "depth", "config-inner") == (
        "| `depth` | integer, ≥ 1, ≤ 9 | `3` | How deep. |"
    )
    assert '`"a"` or `"b"` or null' in _row(text, "mode", "config-top-level")


def test_nested_sections_are_links_and_every_link_has_its_target() -> None:
    text = render(Root).text
    pets = _row(text, "pets", "config-top-level")
    assert "list of [`cat`](#config-pets-kind-cat) or [`dog`](#config-pets-kind-dog)" in pets
    assert "[its defaults](#config-inner)" in _row(text, "inner", "config-top-level")
    # Inner is met first under `inner`: `by_name` and the dog's `inner` link there.
    assert "mapping of string to [`inner`](#config-inner)" in _row(
        text, "by_name", "config-top-level"
    )
    links = set(re.findall(r"\]\(#([a-z0-9-]+)\)", text))
    assert links <= set(re.findall(r"^\(([a-z0-9-]+)\)=$", text, flags=re.MULTILINE))


def test_a_field_without_description_and_a_model_without_docstring_are_problems() -> None:
    class Bare(BaseModel):
        count: int = 0

    class Top(BaseModel):
        """Top."""

        bare: Bare = Field(default_factory=Bare, description="A bare section.")
        mode: Literal["a", "b"] | None = None

    assert render(Top).problems == [
        "config field mode has no description",
        "config section bare has no docstring",
        "config field bare.count has no description",
    ]


def test_the_server_configuration_is_described_in_full() -> None:
    page = render(ServerConfig, ENV_VARS)
    assert page.problems == []
    assert "## `models[]` (`kind: generate`)" in page.text
    assert "Environment: `CONVEYOR_PORT`." in _row(page.text, "port", "config-top-level")
    links = set(re.findall(r"\]\(#([a-z0-9-]+)\)", page.text))
    assert links <= set(re.findall(r"^\(([a-z0-9-]+)\)=$", page.text, flags=re.MULTILINE))
