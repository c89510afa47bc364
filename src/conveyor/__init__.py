"""Conveyor: an inference batching service."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("conveyor")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0.0.0+unknown"
