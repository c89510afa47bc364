"""The last ``make mutate`` run as ``bench/results/mutation.json``: the score per target and
every surviving mutant with its verdict.

Reads mutmut's results through its own commands (``mutmut results --all true`` for each
mutant's status, ``mutmut show NAME`` for a survivor's diff), so run it from the repo
root after ``make mutate``, with the same mutmut. Targets are the ``only_mutate`` patterns
of ``[tool.mutmut]`` in pyproject.toml. Verdicts on survivors (equivalent or not, and
why) are judged by hand and kept in ``bench/mutation_verdicts.yaml``, each with the
mutated line it was judged on: a verdict whose line is no longer the mutant's (the code
moved on) is not applied, and the survivor is listed as unjudged.

    .venv/bin/python -m bench.mutation_report [--run-seconds S] [--load L] [--history TEXT]
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import subprocess
import sys
import tomllib
from collections import Counter
from importlib.metadata import version
from pathlib import Path
from typing import Any

import yaml

from bench.common import REPO_ROOT, RESULTS_DIR, machine_info, write_json

VERDICTS = REPO_ROOT / "bench" / "mutation_verdicts.yaml"
CAUGHT = ("killed", "timeout")
# What each status of ``mutmut results`` counts as here.
STATUSES = ("killed", "timeout", "survived", "no tests", "skipped", "suspicious", "not checked")


def mutmut(*args: str) -> str:
    """The output of one mutmut command (the mutmut beside this Python), failing loudly."""
    executable = Path(sys.executable).with_name("mutmut")
    done = subprocess.run(
        [str(executable), *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"mutmut {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def statuses() -> dict[str, str]:
    """Every mutant's name and status."""
    found: dict[str, str] = {}
    for line in mutmut("results", "--all", "true").splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and "__mutmut_" in name:
            found[name] = status
    return found


def source_path(mutant: str) -> str:
    """The source file a mutant's name points at (``conveyor.a.b.x_f__mutmut_1``)."""
    module = mutant.split(".x_")[0].split(".xǁ")[0]
    return "src/" + module.replace(".", "/") + ".py"


def target_of(path: str, patterns: list[str]) -> str:
    """The ``only_mutate`` target a file belongs to (``batching/``, ``fleet/router.py``)."""
    for pattern in patterns:
        if fnmatch.fnmatch(path, pattern):
            label = pattern.removeprefix("src/conveyor/")
            return label.removesuffix("*")
    return path


def changed_lines(diff: str) -> list[str]:
    """The diff's removed and added lines, without its file headers."""
    return [
        line
        for line in diff.splitlines()
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]


def judged(name: str, status: str, target: str, verdicts: dict[str, Any]) -> dict[str, Any]:
    """One mutant that was not killed: where, what changed, its status and its verdict
    (None: unjudged)."""
    lines = changed_lines(mutmut("show", name))
    verdict = verdicts.get(name)
    if verdict is not None and verdict.get("line") not in lines:
        verdict = None  # judged on another mutation: the code moved on
    return {
        "name": name,
        "target": target,
        "status": status,
        "diff": lines,
        "equivalent": None if verdict is None else bool(verdict["equivalent"]),
        "why": None if verdict is None else verdict["why"],
    }


def score(statuses_of: list[str], judged_equivalent: list[dict[str, Any]]) -> dict[str, Any]:
    """Mutants, caught (failed a test or hung), survived and equivalent, of one target.

    A mutant judged equivalent counts as equivalent whatever its status: on a loaded
    machine one may also run past its time limit, which is no catch.
    """
    counts = Counter(statuses_of)
    equivalent_timeouts = sum(1 for m in judged_equivalent if m["status"] == "timeout")
    caught = sum(counts[status] for status in CAUGHT) - equivalent_timeouts
    return {
        "mutants": len(statuses_of),
        "killed": counts["killed"],
        "timeout": counts["timeout"],
        "survived": counts["survived"],
        "other": {s: n for s, n in counts.items() if s not in (*CAUGHT, "survived")},
        "equivalent": len(judged_equivalent),
        "caught_non_equivalent": caught,
        "score_non_equivalent": caught / max(1, len(statuses_of) - len(judged_equivalent)),
    }


def report(run_seconds: float | None, load: float | None, history: list[str]) -> dict[str, Any]:
    """The whole report from mutmut's results and the verdicts file."""
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    patterns: list[str] = config["only_mutate"]
    verdicts = yaml.safe_load(VERDICTS.read_text()) if VERDICTS.exists() else None
    by_target: dict[str, list[str]] = {}
    not_killed = []
    for name, status in sorted(statuses().items()):
        target = target_of(source_path(name), patterns)
        by_target.setdefault(target, []).append(status)
        if status == "survived" or (status == "timeout" and name in (verdicts or {})):
            not_killed.append(judged(name, status, target, verdicts or {}))
    survivors = [m for m in not_killed if m["status"] == "survived"]
    timed_out = [m for m in not_killed if m["status"] == "timeout" and m["equivalent"]]
    equivalent = [m for m in not_killed if m["equivalent"]]
    targets = {
        t: score(s, [m for m in equivalent if m["target"] == t])
        for t, s in sorted(by_target.items())
    }
    total = score([s for ss in by_target.values() for s in ss], equivalent)
    total["unjudged"] = sum(1 for m in survivors if m["equivalent"] is None)
    return {
        "date": datetime.date.today().isoformat(),
        "mutmut": version("mutmut"),
        "command": "make mutate",
        "run_seconds": run_seconds,
        "load_average": load,
        "history": history,
        "tests": config.get("pytest_add_cli_args_test_selection"),
        "timeout_multiplier": config.get("timeout_multiplier"),
        "total": total,
        "targets": targets,
        "survivors": survivors,
        "equivalent_timeouts": timed_out,
        "machine": machine_info(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run-seconds", type=float, help="how long mutmut run took")
    parser.add_argument("--load", type=float, help="the machine's load average during it")
    parser.add_argument(
        "--history", action="append", default=[], help="a line on how the results were made"
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    result = report(args.run_seconds, args.load, args.history)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "mutation.json", result)
    total = result["total"]
    print(
        f"{total['caught_non_equivalent']}/{total['mutants']} caught, "
        f"{total['survived']} survived, "
        f"{total['equivalent']} equivalent, {total['unjudged']} unjudged: "
        f"{100 * total['score_non_equivalent']:.1f}% of the non-equivalent"
    )


if __name__ == "__main__":
    main()
