"""One exception root; each error knows its HTTP status and OpenAI error body."""

from __future__ import annotations

from typing import Any

# What a client is told to wait before retrying after a store failure; a store that comes back
# is used again at once, so this is only the client's pacing.
STORE_RETRY_AFTER_S = 5


class ConveyorError(Exception):
    """Root of every error Conveyor raises on purpose.

    ``status_code`` is the HTTP status the API answers with; ``error_type`` and
    ``code`` fill the OpenAI error body ``{"error": {message, type, param, code}}``.
    """

    status_code: int = 500
    error_type: str = "server_error"
    default_code: str | None = None
    # Seconds a caller should wait before retrying (``Retry-After``); None: not retryable.
    default_retry_after_s: int | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: int | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code
        self.retry_after_s = (
            retry_after_s if retry_after_s is not None else self.default_retry_after_s
        )

    def to_body(self) -> dict[str, Any]:
        """The OpenAI-shaped error body."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def headers(self) -> dict[str, str]:
        """Extra HTTP headers this error carries: ``Retry-After`` when it is retryable."""
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(self.retry_after_s)}


class InvalidRequest(ConveyorError):
    """The request is malformed or breaks a limit: 400."""

    status_code = 400
    error_type = "invalid_request_error"


class InputRejected(InvalidRequest):
    """The model rejected one input (found by running it): 400."""

    default_code = "input_rejected"


class DeadlineTooShort(InvalidRequest):
    """The request's own work outlasts its deadline on this model whatever the load (a
    prompt's prefill alone): 400, since retrying it as it is can never succeed."""

    default_code = "deadline_too_short"


class RequestTooLarge(ConveyorError):
    """The request body is larger than ``max_request_bytes``: 413."""

    status_code = 413
    error_type = "invalid_request_error"
    default_code = "request_too_large"

    def headers(self) -> dict[str, str]:
        """The rest of the body is not read, so the connection cannot be reused."""
        return {"Connection": "close"}


class HeadersTooLarge(ConveyorError):
    """The request head is longer than ``max_header_bytes`` or has more than ``max_headers``
    fields: 431, and the connection is closed (what more the client sends is dropped)."""

    status_code = 431
    error_type = "invalid_request_error"
    default_code = "headers_too_large"


class AuthenticationFailed(ConveyorError):
    """Missing or wrong API key: 401."""

    status_code = 401
    error_type = "invalid_request_error"
    default_code = "invalid_api_key"


class PermissionDenied(ConveyorError):
    """The caller's key may not do this (an admin key may): 403."""

    status_code = 403
    error_type = "invalid_request_error"
    default_code = "permission_denied"


class NotFound(ConveyorError):
    """The named resource does not exist (or belongs to another tenant): 404."""

    status_code = 404
    error_type = "invalid_request_error"
    default_code = "not_found"


class ModelNotFound(NotFound):
    """No model of that name is served here: 404."""

    default_code = "model_not_found"


class RequestTimeout(ConveyorError):
    """The client took too long to send its request head or body: 408."""

    status_code = 408
    error_type = "invalid_request_error"
    default_code = "request_timeout"


class QueueFull(ConveyorError):
    """Admission refused because the queue is at its bound: 429 with Retry-After."""

    status_code = 429
    error_type = "rate_limit_error"
    default_code = "queue_full"

    def __init__(self, message: str, *, retry_after_s: int, code: str | None = None):
        super().__init__(message, code=code, retry_after_s=retry_after_s)


class DeadlineExceeded(ConveyorError):
    """The request's deadline passed (or would pass) before it could run: 504."""

    status_code = 504
    error_type = "timeout_error"
    default_code = "deadline_exceeded"


class ClientGone(ConveyorError):
    """The caller disconnected; nothing is sent back (nginx's 499 in logs)."""

    status_code = 499
    error_type = "client_closed_request"
    default_code = "client_gone"


class ModelFault(ConveyorError):
    """The model failed on an input it should have handled: 500."""

    status_code = 500
    error_type = "server_error"
    default_code = "model_error"


class ModelContractError(ModelFault):
    """The model broke its contract (for example, wrong number of outputs): 500."""

    default_code = "model_contract_violation"


class ModelOutOfMemory(ConveyorError):
    """The device ran out of memory on a batch; the batcher halves and retries."""

    status_code = 503
    error_type = "server_error"
    default_code = "out_of_memory"


class ServiceUnavailable(ConveyorError):
    """Not ready, or shutting down: 503."""

    status_code = 503
    error_type = "server_error"
    default_code = "unavailable"


class TooManyConnections(ServiceUnavailable):
    """Every place under ``max_connections`` is held by a request in progress, or this
    connection made way for a newer one before it sent a whole request head: 503."""

    default_code = "too_many_connections"
    default_retry_after_s = 1

    def headers(self) -> dict[str, str]:
        """Retry on a new connection: this one is closed."""
        return {**super().headers(), "Connection": "close"}


class StoreUnavailable(ServiceUnavailable):
    """A store cannot be reached, timed out or is out of space: 503 with Retry-After.

    Raised from the store layer (chained to the driver's error) so the API answers a clear,
    retryable 503 instead of a 500 or a hang. Subclasses name the store in `code`.
    """

    default_code = "store_unavailable"
    store_name = "store"

    default_retry_after_s = STORE_RETRY_AFTER_S


class JobStoreUnavailable(StoreUnavailable):
    """The job store (SQLite or PostgreSQL) is unreachable, timed out or full: 503."""

    default_code = "job_store_unavailable"
    store_name = "job_store"


class ObjectStoreUnavailable(StoreUnavailable):
    """The object store (local directory or S3) failed to read or write: 503."""

    default_code = "object_store_unavailable"
    store_name = "object_store"


class ConfigError(ConveyorError):
    """The configuration is invalid; raised once at start-up."""


class RateLimited(ConveyorError):
    """A tenant's request or token limit is spent for now: 429 with Retry-After.

    As OpenAI's, the error's ``type`` names the limit's kind (``requests`` or ``tokens``).
    """

    status_code = 429
    default_code = "rate_limit_exceeded"

    def __init__(
        self,
        message: str,
        *,
        kind: str,
        retry_after_s: int,
        extra_headers: dict[str, str] | None = None,
    ):
        super().__init__(message, retry_after_s=retry_after_s)
        self.error_type = kind
        self.extra_headers = extra_headers or {}

    def headers(self) -> dict[str, str]:
        """The limit's ``x-ratelimit-*`` headers and ``Retry-After``."""
        return {**self.extra_headers, **super().headers()}


class TokensExceedLimit(InvalidRequest):
    """A request needs more tokens than its tenant's bucket can ever hold: 400, not 429."""

    default_code = "tokens_exceed_rate_limit"


class InsufficientQuota(ConveyorError):
    """The tenant's monthly budget is spent: 429 with OpenAI's ``insufficient_quota``."""

    status_code = 429
    error_type = "insufficient_quota"
    default_code = "insufficient_quota"


class RateLimitBackendDown(ServiceUnavailable):
    """The shared rate-limit store cannot be reached and the policy is to deny: 503."""

    default_code = "rate_limit_backend_unavailable"
    default_retry_after_s = 1
