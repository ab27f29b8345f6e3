"""Runs trials as local subprocesses, at most `max_parallel` at a time.

Each trial writes `launch.log` (stdout and stderr together) and `command.sh`
(the exact command, re-runnable) into its own workdir. The returned results
hold every exit code; `summary_table` renders them with rich. Ctrl-C stops the
running trials (SIGTERM, then SIGKILL after a grace period) and reports the
rest as not started, so an interrupted sweep still says what finished.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import IO

from rich.console import Console
from rich.table import Table

from launch.trials import Trial

LOG_NAME = "launch.log"
COMMAND_NAME = "command.sh"
TERMINATE_GRACE_S = 10.0


@dataclasses.dataclass(frozen=True)
class TrialResult:
    """How one trial ended. `returncode` is None when it never started."""

    trial: Trial
    status: str  # "ok" | "failed" | "interrupted" | "not started"
    returncode: int | None
    duration_s: float
    log_path: str

    def to_json(self) -> dict:
        return {
            "index": self.trial.index,
            "name": self.trial.name,
            "status": self.status,
            "returncode": self.returncode,
            "duration_s": round(self.duration_s, 3),
            "workdir": self.trial.workdir,
            "log": self.log_path,
            "command": self.trial.command,
            "overrides": self.trial.overrides,
        }


@dataclasses.dataclass
class _Running:
    trial: Trial
    process: subprocess.Popen
    log: IO[bytes]  # the open log file, closed when the process ends
    started: float


def _start(trial: Trial, env: Mapping[str, str], cwd: str | None) -> _Running:
    workdir = pathlib.Path(trial.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / COMMAND_NAME).write_text(f"#!/usr/bin/env bash\n{trial.command}\n")
    log = open(workdir / LOG_NAME, "ab")
    try:
        process = subprocess.Popen(
            list(trial.argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env),
            cwd=cwd,
        )
    except OSError:
        log.close()
        raise
    return _Running(trial, process, log, time.monotonic())


def _finish(run: _Running, status: str | None = None) -> TrialResult:
    run.log.close()
    code = run.process.returncode
    status = status or ("ok" if code == 0 else "failed")
    log_path = str(pathlib.Path(run.trial.workdir) / LOG_NAME)
    return TrialResult(run.trial, status, code, time.monotonic() - run.started, log_path)


def _failed_to_start(trial: Trial, error: OSError) -> TrialResult:
    log_path = pathlib.Path(trial.workdir) / LOG_NAME
    with open(log_path, "a") as log:
        log.write(f"launch: could not start {trial.command}: {error}\n")
    return TrialResult(trial, "failed", None, 0.0, str(log_path))


def _stop(running: list[_Running]) -> None:
    """SIGTERM every running trial, then SIGKILL what is left after the grace period."""
    for run in running:
        if run.process.poll() is None:
            run.process.terminate()
    deadline = time.monotonic() + TERMINATE_GRACE_S
    for run in running:
        try:
            run.process.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            run.process.kill()
            run.process.wait()


def run_local(
    trials: Sequence[Trial],
    *,
    max_parallel: int = 1,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    console: Console | None = None,
    poll_interval_s: float = 0.05,
) -> list[TrialResult]:
    """Runs every trial's `argv`, at most `max_parallel` at once; results in trial order."""
    if max_parallel < 1:
        raise ValueError(f"max_parallel must be at least 1, got {max_parallel}")
    console = console or Console(stderr=True)
    # Unbuffered output so `tail -f launch.log` shows progress as it happens.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    pending = list(trials)
    running: list[_Running] = []
    results: dict[int, TrialResult] = {}
    try:
        while pending or running:
            while pending and len(running) < max_parallel:
                trial = pending.pop(0)
                try:
                    run = _start(trial, env, cwd)
                except OSError as error:  # e.g. the program does not exist: a failed trial
                    results[trial.index] = _failed_to_start(trial, error)
                    console.print(f"[red]failed[/] {trial.name}: could not start: {error}")
                    continue
                running.append(run)
                console.print(f"[cyan]started[/] {trial.name}  (log: {trial.workdir}/{LOG_NAME})")
            for run in [r for r in running if r.process.poll() is not None]:
                running.remove(run)
                result = _finish(run)
                results[run.trial.index] = result
                colour = "green" if result.status == "ok" else "red"
                console.print(
                    f"[{colour}]{result.status}[/] {run.trial.name} (exit {result.returncode})"
                )
            time.sleep(poll_interval_s)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping running trials[/]")
        _stop(running)
        for run in running:
            results[run.trial.index] = _finish(run, "interrupted")
        for trial in pending:
            results[trial.index] = TrialResult(
                trial, "not started", None, 0.0, str(pathlib.Path(trial.workdir) / LOG_NAME)
            )
    return [results[t.index] for t in trials]


def summary_table(results: Sequence[TrialResult], title: str = "sweep") -> Table:
    """A rich table: trial, status, exit code, duration and log path."""
    table = Table(title=title)
    for column in ("trial", "status", "exit", "time", "log"):
        table.add_column(column, overflow="fold")
    colours = {"ok": "green", "failed": "red", "interrupted": "yellow", "not started": "dim"}
    for r in results:
        table.add_row(
            r.trial.name,
            f"[{colours[r.status]}]{r.status}[/]",
            "" if r.returncode is None else str(r.returncode),
            f"{r.duration_s:.1f}s",
            r.log_path,
        )
    return table
