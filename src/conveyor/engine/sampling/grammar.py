"""Constrained decoding: grammars from JSON schemas, checked and matched with llguidance.

llguidance (Rust, no torch) compiles a JSON schema or a Lark grammar lazily against the
tokenizer, so a mask over the whole vocabulary costs tens of microseconds per token and
needs no per-schema precompilation. A grammar travels in :class:`SamplingParams` as
llguidance's own string (hashable, shared by every choice of a request); it is compiled
once, when the request is checked, and each sequence gets its own
:class:`llguidance.LLMatcher`, a copy of that compiled one, advanced on the engine thread.

Torch-free: the HTTP layer imports this to check a schema before a request is queued;
applying masks to logits lives in ``mask``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Collection, Mapping
from typing import Any

import llguidance

from conveyor.engine.sampling.grammar_cache import GrammarCache
from conveyor.engine.tokenizer import Tokenizer

__all__ = [
    "JSON_OPTIONS",
    "GrammarCompiler",
    "grammar_from_json_schema",
    "grammar_from_lark",
]

# Compact, deterministic JSON: a single space after ':' and ',' and no other whitespace,
# so a model cannot spend its token budget on indentation.
JSON_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}


def grammar_from_json_schema(schema: Mapping[str, Any]) -> str:
    """llguidance's grammar string for output that is one JSON value matching ``schema``."""
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(
            dict(schema),
            defaults=JSON_OPTIONS,  # type: ignore[arg-type]  # a TypedDict llguidance keeps private
        )
    except (ValueError, TypeError) as exc:
        raise ValueError(f"the JSON schema is invalid: {exc}") from None


def grammar_from_lark(lark: str) -> str:
    """llguidance's grammar string for a Lark grammar (``%json {...}`` embeds a schema)."""
    return llguidance.LLMatcher.grammar_from_lark(lark)


def json_lark_rule(schema: Mapping[str, Any]) -> str:
    """A Lark right-hand side matching one JSON value of ``schema`` (compact separators)."""
    options = {**schema, "x-guidance": {**JSON_OPTIONS, **schema.get("x-guidance", {})}}
    return "%json " + json.dumps(options, separators=(",", ":"), sort_keys=False)


class GrammarCompiler:
    """Checks grammars and builds matchers for one model's tokenizer (thread-safe).

    The llguidance tokenizer is built on first use (it walks the whole vocabulary once)
    and shared after that. ``vocab_size`` is the width of the model's logits, which may
    exceed the tokenizer's; ids past the tokenizer are never allowed.
    """

    def __init__(
        self, tokenizer: Tokenizer, *, vocab_size: int, eos_token_ids: Collection[int]
    ) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos_token_ids = sorted(eos_token_ids)
        self._lock = threading.Lock()
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._compiled = GrammarCache(self._compile, _copy_matcher)

    @property
    def vocab_size(self) -> int:
        """Width of the masks this compiler's matchers fill."""
        return self._vocab_size

    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        """The llguidance view of the tokenizer (built once)."""
        with self._lock:
            if self._ll_tokenizer is None:
                self._ll_tokenizer = self._build_tokenizer()
            return self._ll_tokenizer

    def check(self, grammar: str) -> None:
        """ValueError unless ``grammar`` compiles for this model and admits some output.

        Compiles it once (``grammar_cache``): the engine's matchers for it are copies. A
        grammar can compile yet match nothing (a schema that is only ``{"$ref": "#"}``):
        llguidance finds that out when it fills the first mask, so one is filled here
        (GIL released; microseconds for ordinary schemas) rather than in the engine, where
        the reply would end at once with text that is not JSON.
        """
        self._compiled.compile(grammar)

    def matcher(self, grammar: str) -> llguidance.LLMatcher:
        """A fresh matcher at the grammar's start: a copy of the grammar compiled (and
        checked) once; ValueError if the grammar is invalid."""
        return self._compiled.get(grammar)

    def _compile(self, grammar: str) -> llguidance.LLMatcher:
        """The checked matcher of ``grammar`` at its start, to be copied (see ``check``)."""
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, self.ll_tokenizer()
        )
        if is_error:
            raise ValueError(messages[0] if messages else "the grammar is invalid")
        matcher = llguidance.LLMatcher(self.ll_tokenizer(), grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        probe = matcher.deep_copy()  # the kept matcher stays at the start, its mask unfilled
        probe.compute_bitmask()
        if probe.is_error():
            raise ValueError(
                "no output can satisfy it (for a JSON schema: no value matches it, as with a "
                "$ref that leads only back to itself)"
            )
        return matcher

    def _build_tokenizer(self) -> llguidance.LLTokenizer:
        """Wrap the Hugging Face fast tokenizer; EOS ids are the engine's, not only its own."""
        import llguidance.hf

        hf = self._tokenizer.hf
        return llguidance.hf.from_tokenizer(
            hf, n_vocab=max(self._vocab_size, len(hf)), eos_token=self._eos_token_ids or None
        )


def _copy_matcher(matcher: llguidance.LLMatcher) -> llguidance.LLMatcher:
    """An independent matcher in ``matcher``'s state."""
    return matcher.deep_copy()
