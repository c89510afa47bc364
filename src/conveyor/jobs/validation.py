"""Checks made before a batch runs: its create parameters and every line of its input file.

A bad input file fails the whole batch, with each bad line listed (1-based line numbers, as
an editor shows them). Body problems that only show when a request runs (an input too long
for the model, say) are not checked here: they become records in the error file.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from conveyor.errors import InvalidRequest
from conveyor.openai_paths import BATCH_ENDPOINTS
from conveyor.stores.records import BatchError
from conveyor.tenants.estimate import body_input_tokens

MAX_CUSTOM_ID_CHARS = 512
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
_WINDOW = re.compile(r"^([1-9][0-9]{0,6})(s|m|h)$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0}


class LineErrorCode(enum.StrEnum):
    """Codes of the validation errors listed in a failed batch's `errors`."""

    INVALID_JSON = "invalid_json_line"
    INVALID_LINE = "invalid_request_line"
    MISSING_CUSTOM_ID = "missing_custom_id"
    DUPLICATE_CUSTOM_ID = "duplicate_custom_id"
    INVALID_METHOD = "invalid_method"
    MISMATCHED_URL = "mismatched_endpoint"
    INVALID_BODY = "invalid_body"
    MISSING_MODEL = "missing_model"
    MODEL_NOT_FOUND = "model_not_found"
    MISMATCHED_MODEL = "mismatched_model"
    TOO_MANY_REQUESTS = "too_many_requests"
    EMPTY_FILE = "empty_file"
    TOO_MANY_ERRORS = "too_many_errors"
    TOKEN_LIMIT_EXCEEDED = "token_limit_exceeded"


def parse_completion_window(window: object, *, min_s: float, max_s: float) -> float:
    """Seconds in a window such as `24h`, `90m` or `30s`; 400 outside `[min_s, max_s]`."""
    match = _WINDOW.match(window) if isinstance(window, str) else None
    if match is None:
        raise InvalidRequest(
            f"completion_window must look like '24h', '90m' or '30s', got {window!r}",
            param="completion_window",
        )
    seconds = int(match.group(1)) * _UNIT_S[match.group(2)]
    if not min_s <= seconds <= max_s:
        raise InvalidRequest(
            f"completion_window must be between {min_s:g} s and {max_s:g} s, got {window!r}",
            param="completion_window",
        )
    return seconds


def check_endpoint(endpoint: object) -> str:
    """The endpoint if batches support it, else 400."""
    if endpoint not in BATCH_ENDPOINTS:
        raise InvalidRequest(
            f"endpoint must be one of {', '.join(BATCH_ENDPOINTS)}, got {endpoint!r}",
            param="endpoint",
        )
    return str(endpoint)


def check_metadata(metadata: object) -> dict[str, str] | None:
    """OpenAI's metadata limits: up to 16 pairs, keys <= 64 and values <= 512 characters."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or len(metadata) > MAX_METADATA_PAIRS:
        raise InvalidRequest(
            f"metadata must be an object of at most {MAX_METADATA_PAIRS} pairs", param="metadata"
        )
    for key, value in metadata.items():
        if not isinstance(value, str) or len(key) > MAX_METADATA_KEY_CHARS:
            raise InvalidRequest(
                f"metadata keys must be <= {MAX_METADATA_KEY_CHARS} characters and values "
                "must be strings",
                param="metadata",
            )
        if len(value) > MAX_METADATA_VALUE_CHARS:
            raise InvalidRequest(
                f"metadata values must be <= {MAX_METADATA_VALUE_CHARS} characters",
                param="metadata",
            )
    return dict(metadata)


@dataclass(slots=True)
class ValidationReport:
    """What validating an input file found."""

    errors: list[BatchError]
    model: str | None
    num_requests: int
    num_input_tokens: int = 0  # estimated, as the online limiter estimates

    @property
    def is_valid(self) -> bool:
        """True when the batch may run."""
        return not self.errors


@dataclass(slots=True)
class InputValidator:
    """Checks input lines one at a time; `finish` returns the report.

    Memory stays small for big files: custom_ids are remembered as 16-byte digests.
    """

    endpoint: str
    is_model_served: Callable[[str], bool]
    max_requests: int
    max_listed_errors: int
    _errors: list[BatchError] = field(default_factory=list, init=False)
    _num_errors: int = field(default=0, init=False)
    _seen_ids: set[bytes] = field(default_factory=set, init=False)
    _model: str | None = field(default=None, init=False)
    _checked_models: dict[str, bool] = field(default_factory=dict, init=False)
    _num_requests: int = field(default=0, init=False)
    _num_input_tokens: int = field(default=0, init=False)

    def check_line(self, line_no: int, raw: bytes) -> bool:
        """Check the 0-based line `line_no`; True when it is a request (not blank)."""
        if not raw.strip():
            return False  # blank lines (a trailing newline, say) are not requests
        self._num_requests += 1
        if self._num_requests == self.max_requests + 1:
            self._add(
                line_no,
                LineErrorCode.TOO_MANY_REQUESTS,
                f"a batch holds at most {self.max_requests} requests",
            )
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            self._add(line_no, LineErrorCode.INVALID_JSON, f"this line is not valid JSON: {exc}")
            return True
        if not isinstance(data, dict):
            self._add(line_no, LineErrorCode.INVALID_LINE, "each line must be a JSON object")
            return True
        self._check_request(line_no, data)
        return True

    def _check_request(self, line_no: int, data: dict[str, Any]) -> None:
        """Check the envelope fields of one decoded line."""
        self._check_custom_id(line_no, data.get("custom_id"))
        if data.get("method") != "POST":
            message = f"method must be 'POST', got {data.get('method')!r}"
            self._add(line_no, LineErrorCode.INVALID_METHOD, message, "method")
        if data.get("url") != self.endpoint:
            message = f"url must be the batch's endpoint {self.endpoint!r}, got {data.get('url')!r}"
            self._add(line_no, LineErrorCode.MISMATCHED_URL, message, "url")
        body = data.get("body")
        if not isinstance(body, dict):
            self._add(line_no, LineErrorCode.INVALID_BODY, "body must be a JSON object", "body")
            return
        self._check_model(line_no, body.get("model"))
        self._num_input_tokens += body_input_tokens(body, self.endpoint)

    def _check_custom_id(self, line_no: int, custom_id: object) -> None:
        """custom_id: a non-empty string, not too long, unique in the file."""
        code = LineErrorCode.MISSING_CUSTOM_ID
        if not isinstance(custom_id, str) or not custom_id:
            self._add(line_no, code, "custom_id must be a non-empty string", "custom_id")
            return
        if len(custom_id) > MAX_CUSTOM_ID_CHARS:
            message = f"custom_id must be <= {MAX_CUSTOM_ID_CHARS} characters"
            self._add(line_no, code, message, "custom_id")
            return
        digest = hashlib.blake2b(custom_id.encode(), digest_size=16).digest()
        if digest in self._seen_ids:
            message = f"custom_id {custom_id!r} appears more than once"
            self._add(line_no, LineErrorCode.DUPLICATE_CUSTOM_ID, message, "custom_id")
        self._seen_ids.add(digest)

    def _check_model(self, line_no: int, model: object) -> None:
        """The model must be named, served here, and the same on every line."""
        if not isinstance(model, str) or not model:
            self._add(
                line_no,
                LineErrorCode.MISSING_MODEL,
                "body.model must be a non-empty string",
                "body.model",
            )
            return
        is_served = self._checked_models.get(model)
        if is_served is None:
            is_served = self._checked_models[model] = self.is_model_served(model)
        if not is_served:
            self._add(
                line_no,
                LineErrorCode.MODEL_NOT_FOUND,
                f"the model {model!r} is not served here",
                "body.model",
            )
        elif self._model is None:
            self._model = model
        elif model != self._model:
            self._add(
                line_no,
                LineErrorCode.MISMATCHED_MODEL,
                f"every line must use one model; line uses {model!r}, earlier lines "
                f"{self._model!r}",
                "body.model",
            )

    def _add(
        self, line_no: int, code: LineErrorCode, message: str, param: str | None = None
    ) -> None:
        """Record an error against the 0-based `line_no` (listed 1-based)."""
        self._num_errors += 1
        if len(self._errors) < self.max_listed_errors:
            self._errors.append(BatchError(code.value, message, param, line_no + 1))

    def finish(self) -> ValidationReport:
        """The report: errors (with a summary entry when some were not listed)."""
        errors = list(self._errors)
        num_unlisted = self._num_errors - len(errors)
        if num_unlisted > 0:
            errors.append(
                BatchError(
                    LineErrorCode.TOO_MANY_ERRORS.value,
                    f"{num_unlisted} further errors are not listed",
                )
            )
        if self._num_requests == 0:
            errors.append(
                BatchError(LineErrorCode.EMPTY_FILE.value, "the input file holds no requests")
            )
        return ValidationReport(errors, self._model, self._num_requests, self._num_input_tokens)
