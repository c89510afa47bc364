"""The report of a server that exited before it was ready."""

from __future__ import annotations

from tests.exit_report import exit_report, first_error

LOG = "\n".join(
    ["INFO: Started server process [1]", "INFO: Waiting for application startup."]
    + ["ERROR: Traceback (most recent call last):", '  File "x.py", line 1', "OSError: port"]
    + [f"noise {n}" for n in range(100)]
)


def test_the_first_error_leads_and_is_cut_to_its_lines() -> None:
    error = first_error(LOG, lines=3)
    assert error.splitlines() == [
        "ERROR: Traceback (most recent call last):", '  File "x.py", line 1', "OSError: port"
    ]  # fmt: skip


def test_a_log_without_an_error_has_none() -> None:
    assert first_error("INFO: fine\nINFO: still fine") == ""


def test_the_report_names_the_exit_code_and_puts_the_error_before_the_whole_log() -> None:
    report = exit_report("on-vllm", 1, LOG)
    assert report.startswith("on-vllm exited early (exit code 1); its first error:\nERROR:")
    assert report.index("OSError: port") < report.index("--- its whole log ---")
    assert report.endswith(LOG)
