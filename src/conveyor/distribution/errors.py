"""Errors of model distribution, under the project's one exception root."""

from __future__ import annotations

from conveyor.errors import ConfigError, ServiceUnavailable


class UnknownModel(ConfigError):
    """A `conveyor://NAME` entry names no pushed model."""


class ModelPullFailed(ServiceUnavailable):
    """A model could not be pulled (a chunk missing from every source, a full disk): 503."""


class CorruptChunk(ModelPullFailed):
    """Bytes fetched or read for a chunk do not have the chunk's size or SHA-256."""

    def __init__(self, digest: str, detail: str) -> None:
        """Name the chunk and what was wrong with it."""
        super().__init__(f"chunk {digest}: {detail}")
        self.digest = digest
