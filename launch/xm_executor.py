"""Launches a sweep as one XManager experiment with one job per trial.

Needs `pip install xmanager` (and Docker, plus a GCP project for Vertex AI).
The repository is packaged once as an `xm.PythonContainer` whose entry point is
the training module; each trial becomes an `xm.Job` whose args are the trial's
flags (`{"config.rl.lr": "1e-06"}` → `--config.rl.lr=1e-06`).

What was verified: the objects built here (container spec, executors, requirements,
jobs and their rendered args) were checked against xmanager 0.8.5 with a
stand-in experiment (tests/test_launch_sweep.py runs that check wherever
xmanager is installed). Building the Docker image and launching on Docker or
Vertex AI was not run: neither is available where this was written.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from launch.trials import Trial, format_value

INSTALL_HINT = (
    "the xmanager executor needs XManager: pip install xmanager (and Docker); see launch/README.md"
)
PLATFORMS = ("local", "vertex")
BASE_IMAGE = "python:3.11-slim"


class XManagerMissing(RuntimeError):
    """Raised, with `INSTALL_HINT` as the message, when xmanager cannot be imported."""


def import_xmanager():
    """`(xm, xm_local)`, or XManagerMissing saying how to install them."""
    try:
        from xmanager import xm, xm_local
    except ImportError as error:
        raise XManagerMissing(INSTALL_HINT) from error
    return xm, xm_local


def job_args(trial: Trial, config: str) -> dict[str, str]:
    """The trial's flags as an XManager args dict (rendered as `--key=value`)."""
    args = {"config": config}
    args.update({key: format_value(value) for key, value in trial.overrides.items()})
    args["config.workdir"] = trial.workdir
    return args


def parse_requirements(text: str) -> dict[str, Any]:
    """`"A100=8,cpu=32,ram=128GiB"` → `{"A100": 8, "cpu": 32, "ram": "128GiB"}` for xm.JobRequirements.

    Vertex AI reads accelerators (`A100=8`, `TPU_V3=8`), `cpu` and `ram`; the
    local Docker executor honours only `local_gpu=N`.
    """
    requirements: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise ValueError(f"bad requirement {item!r}: expected NAME=VALUE, e.g. A100=8")
        requirements[name] = int(value) if value.isdigit() else value
    return requirements


def install_extra(requirements: dict[str, Any]) -> str:
    """Which setup.py extra the image needs: `tpu`, `gpu`, or none for CPU-only jobs."""
    names = [name.lower() for name in requirements]
    if any(name.startswith("tpu") for name in names):
        return "tpu"
    if any(name not in ("cpu", "ram", "memory", "ephemeral_storage") for name in names):
        return "gpu"
    return ""


def docker_instructions(repo_root: str, extra: str) -> list[str]:
    """Copy the repository into the image and install it (with `extra`)."""
    name = os.path.basename(os.path.abspath(repo_root).rstrip(os.sep))
    target = f".[{extra}]" if extra else "."
    return [
        f"COPY {name}/ {name}",
        f"WORKDIR {name}",
        f"RUN pip install --no-cache-dir -e '{target}'",
    ]


def _resource_value(xm, value: Any) -> Any:
    """`"128GiB"` → 128 * xm.GiB; numbers pass through."""
    if isinstance(value, str):
        for unit in ("GiB", "MiB"):
            if value.endswith(unit) and value[: -len(unit)].isdigit():
                return int(value[: -len(unit)]) * getattr(xm, unit)
        raise ValueError(f"cannot read resource amount {value!r}; use e.g. 64GiB")
    return value


def launch_xmanager(
    trials: Sequence[Trial],
    *,
    config: str,
    module: str,
    title: str,
    platform: str = "local",
    requirements: str = "",
    repo_root: str = ".",
) -> Any:
    """Creates the experiment, packages the repo once, adds one job per trial; returns its id."""
    if platform not in PLATFORMS:
        raise ValueError(f"unknown XManager platform {platform!r}; choose one of {PLATFORMS}")
    xm, xm_local = import_xmanager()
    wanted = parse_requirements(requirements)
    resources = xm.JobRequirements(**{k: _resource_value(xm, v) for k, v in wanted.items()})
    if platform == "vertex":
        executor = xm_local.Vertex(requirements=resources)
    else:
        executor = xm_local.Local(requirements=resources)
    spec = xm.PythonContainer(
        entrypoint=xm.ModuleName(module),
        path=repo_root,
        base_image=BASE_IMAGE,
        docker_instructions=docker_instructions(repo_root, install_extra(wanted)),
    )
    with xm_local.create_experiment(experiment_title=title) as experiment:
        [executable] = experiment.package(
            [xm.Packageable(executable_spec=spec, executor_spec=executor.Spec())]
        )
        for trial in trials:
            experiment.add(
                xm.Job(executable=executable, executor=executor, args=job_args(trial, config))
            )
    return experiment.experiment_id
