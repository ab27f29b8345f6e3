"""Launches a sweep as one XManager experiment with one job per trial.

Needs `pip install -e ".[xm]"` (xmanager 0.8.5). The trials' jobs share one
packaged executable whose entry point is the training module; each trial
becomes an `xm.Job` whose args are the trial's flags (`{"config.rl.lr":
"1e-06"}` → `--config.rl.lr=1e-06`). Platforms (`--xm_platform`):

- `local`: this machine, no Docker. The executable is an `xm.Binary`: this
  checkout's Python interpreter running `-m <module>` in the current
  directory, launched by XManager's local executor. `launch_xmanager` returns
  once every job has exited; the experiment is recorded in XManager's local
  database (`~/.xmanager/`).
- `docker`: the checkout packaged once as an `xm.PythonContainer` (installing
  `.[gpu]`/`.[tpu]` as the requirements imply), run by the local executor in
  Docker; only `local_gpu=N` of the requirements is honoured.
- `vertex`: the same container on Vertex AI (`A100=8,ram=256GiB`); use a
  `gs://` workdir root.

Tested: `local` end to end against the real library (tests/test_launch_sweep.py
runs a two-job sweep of the `micro` variant); the container's spec against the
real xm objects. Building an image and launching on Docker or Vertex AI was
not run (neither is available where this was written).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from launch.trials import Trial, format_value

INSTALL_HINT = (
    'the xmanager executor needs XManager: pip install -e ".[xm]" (xmanager 0.8.5); '
    "see launch/README.md"
)
PLATFORMS = ("local", "docker", "vertex")
BASE_IMAGE = "python:3.11-slim"


class XManagerMissing(RuntimeError):
    """Raised, with `INSTALL_HINT` as the message, when xmanager cannot be imported."""


class JobsFailed(RuntimeError):
    """A local XManager experiment ended with a failed job (the message says which)."""


def import_xmanager():
    """`(xm, xm_local)`, or XManagerMissing saying how to install them.

    XManager reads absl flags (its database settings); a launcher with its own
    argument parser has not parsed them, so they are parsed here with their
    defaults.
    """
    try:
        from absl import flags
        from xmanager import xm, xm_local
    except ImportError as error:
        raise XManagerMissing(INSTALL_HINT) from error
    if not flags.FLAGS.is_parsed():
        flags.FLAGS([sys.argv[0]], known_only=True)
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


def packageable(
    xm, xm_local, *, platform: str, module: str, repo_root: str, python: str, wanted: dict[str, Any]
):
    """`(xm.Packageable, executor)` for `platform` (see module docstring)."""
    resources = xm.JobRequirements(**{k: _resource_value(xm, v) for k, v in wanted.items()})
    if platform == "vertex":
        executor = xm_local.Vertex(requirements=resources)
    else:
        executor = xm_local.Local(requirements=resources)
    if platform == "local":
        spec = xm.Binary(path=python)
        return xm.Packageable(
            executable_spec=spec, executor_spec=executor.Spec(), args=["-m", module]
        ), executor
    spec = xm.PythonContainer(
        entrypoint=xm.ModuleName(module),
        path=repo_root,
        base_image=BASE_IMAGE,
        docker_instructions=docker_instructions(repo_root, install_extra(wanted)),
    )
    return xm.Packageable(executable_spec=spec, executor_spec=executor.Spec()), executor


def launch_xmanager(
    trials: Sequence[Trial],
    *,
    config: str,
    module: str,
    title: str,
    platform: str = "local",
    requirements: str = "",
    repo_root: str = ".",
    python: str = sys.executable,
) -> Any:
    """Creates the experiment, packages once, adds one job per trial; returns its id.

    With the `local` and `docker` platforms XManager waits for the jobs before
    returning; a failed job raises JobsFailed naming the experiment.
    """
    if platform not in PLATFORMS:
        raise ValueError(f"unknown XManager platform {platform!r}; choose one of {PLATFORMS}")
    xm, xm_local = import_xmanager()
    wanted = parse_requirements(requirements)
    package, executor = packageable(
        xm,
        xm_local,
        platform=platform,
        module=module,
        repo_root=os.path.abspath(repo_root),
        python=python,
        wanted=wanted,
    )
    experiment = None
    try:
        with xm_local.create_experiment(experiment_title=title) as experiment:
            [executable] = experiment.package([package])
            for trial in trials:
                experiment.add(
                    xm.Job(executable=executable, executor=executor, args=job_args(trial, config))
                )
    except RuntimeError as error:  # xm_local: "Process ... returned non-zero code: N"
        experiment_id = getattr(experiment, "experiment_id", "?")
        raise JobsFailed(f"XManager experiment {experiment_id}: a job failed: {error}") from error
    return experiment.experiment_id
