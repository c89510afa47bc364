"""Errors only the Files and Batches API raises (the rest come from `conveyor.errors`)."""

from __future__ import annotations

from conveyor.errors import InvalidRequest


class FileTooLarge(InvalidRequest):
    """The uploaded file is larger than `jobs.max_file_bytes`: 413."""

    status_code = 413
    default_code = "file_too_large"


class BatchNotCancellable(InvalidRequest):
    """Cancel was asked of a batch that already finished (or is finalizing): 400."""

    default_code = "batch_not_cancellable"
