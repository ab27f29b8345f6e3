"""Launch a hyperparameter sweep: one run of the training module per trial.

    python -m launch.sweep --config=experiments/configs/grpo_hle.py:demo \
        --sweep=launch/sweeps/demo_seeds.py [--executor=print|local|xmanager] \
        [--max_parallel=N] [--workdir_root=runs]

The sweep file defines `get_sweep(hyper)` (see launch/hyper.py) and may set
`CONFIG = "path.py:variant"`, used when --config is not given. Trial i runs
`python -m experiments.grpo_hle --config=... --config.a.b=v ...
--config.workdir=<root>/<sweep name>/<i>_<overrides>`. Executors:

- `print` (default): the command lines, nothing runs.
- `local`: subprocesses here, at most --max_parallel at once, each logging to
  `<workdir>/launch.log`; a summary table and `<root>/<sweep>/sweep_summary.json`
  (re-running some trials with --trials updates their entries only).
- `xmanager`: one XManager experiment, one job per trial (needs `pip install -e ".[xm]"`);
  `--xm_platform=local` runs the jobs here without Docker and waits for them.

Every swept key is checked against the config before anything starts.
Exit status: 0 if every trial succeeded, 1 if any failed, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
from collections.abc import Sequence

from rich.console import Console

from launch import config_check, hyper, local_executor, xm_executor
from launch import trials as trials_lib

EXECUTORS = ("print", "local", "xmanager")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m launch.sweep", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--config",
        help="config file and variant, e.g. experiments/configs/grpo_hle.py:demo "
        "(default: the sweep file's CONFIG)",
    )
    parser.add_argument("--sweep", required=True, help="sweep file defining get_sweep(hyper)")
    parser.add_argument("--executor", choices=EXECUTORS, default="print")
    parser.add_argument(
        "--max_parallel", type=int, help="local executor: trials at once (default 1)"
    )
    parser.add_argument(
        "--workdir_root", default="runs", help="trial i runs in <root>/<sweep name>/<i>_<overrides>"
    )
    parser.add_argument(
        "--module", default=trials_lib.DEFAULT_MODULE, help="python module each trial runs"
    )
    parser.add_argument(
        "--python", default=sys.executable, help="interpreter for local and printed commands"
    )
    parser.add_argument(
        "--trials", help="comma-separated trial indices to keep, e.g. 0,3 (default: all)"
    )
    parser.add_argument(
        "--skip_config_check",
        action="store_true",
        help="do not load the config to check the swept keys exist",
    )
    parser.add_argument(
        "--xm_platform",
        choices=xm_executor.PLATFORMS,
        help="xmanager: local (this machine, no Docker; default), docker, or vertex",
    )
    parser.add_argument(
        "--xm_requirements", help="xmanager: resources, e.g. A100=8,ram=256GiB or local_gpu=1"
    )
    return parser


def _check_flag_combinations(args: argparse.Namespace) -> None:
    """Flags that belong to one executor are errors with another, never silently ignored."""
    if args.max_parallel is not None and args.executor != "local":
        raise ValueError("--max_parallel applies only to --executor=local")
    if (args.xm_platform or args.xm_requirements) and args.executor != "xmanager":
        raise ValueError("--xm_platform and --xm_requirements apply only to --executor=xmanager")
    if args.executor == "local" and "://" in args.workdir_root:
        raise ValueError(
            f"--executor=local writes logs into local folders; got --workdir_root={args.workdir_root}"
        )


def _select(all_trials: list[trials_lib.Trial], spec: str | None) -> list[trials_lib.Trial]:
    if not spec:
        return all_trials
    try:
        wanted = [int(part) for part in spec.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--trials must be comma-separated integers, got {spec!r}") from None
    bad = [i for i in wanted if not 0 <= i < len(all_trials)]
    if bad:
        raise ValueError(f"--trials {bad} out of range: the sweep has {len(all_trials)} trials")
    return [all_trials[i] for i in sorted(set(wanted))]


def plan(args: argparse.Namespace) -> tuple[str, str, list[trials_lib.Trial]]:
    """Reads the sweep file and returns (config, sweep name, trials)."""
    _check_flag_combinations(args)
    sweep_file = trials_lib.load_sweep_file(args.sweep)
    config = args.config or getattr(sweep_file, "CONFIG", None)
    if not config:
        raise ValueError(
            f"pass --config=path.py:variant (the sweep file {args.sweep} sets no CONFIG)"
        )
    sweep = hyper.check_sweep(sweep_file.get_sweep(hyper))
    if not args.skip_config_check:
        config_check.check_overrides(config, [key for trial in sweep for key in trial])
    root = args.workdir_root
    if "://" not in root:  # local paths absolute, so trials may run from any directory
        root = os.path.abspath(root)
    name = pathlib.Path(args.sweep).stem
    all_trials = trials_lib.expand(
        config, sweep, sweep_name=name, workdir_root=root, python=args.python, module=args.module
    )
    return config, name, _select(all_trials, args.trials)


def write_summary(path: pathlib.Path, results: Sequence[local_executor.TrialResult]) -> None:
    """Writes the results to `path`, keeping entries of earlier runs for trials not re-run now."""
    entries = {}
    if path.exists():
        entries = {entry["index"]: entry for entry in json.loads(path.read_text())}
    entries.update({result.trial.index: result.to_json() for result in results})
    path.write_text(json.dumps([entries[i] for i in sorted(entries)], indent=2) + "\n")


def _run_local(args, name: str, trials: list[trials_lib.Trial], console: Console) -> int:
    results = local_executor.run_local(trials, max_parallel=args.max_parallel or 1, console=console)
    Console().print(local_executor.summary_table(results, title=f"sweep {name}"))
    summary_path = pathlib.Path(trials[0].workdir).parent / "sweep_summary.json"
    write_summary(summary_path, results)
    failed = [r for r in results if r.status != "ok"]
    console.print(
        f"{len(results) - len(failed)}/{len(results)} trials ok; summary in {summary_path}"
    )
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console(stderr=True)
    try:
        config, name, trials = plan(args)
        if args.executor == "print":
            for trial in trials:
                print(trial.command)
            return 0
        if args.executor == "local":
            return _run_local(args, name, trials, console)
        platform = args.xm_platform or "local"
        try:
            experiment_id = xm_executor.launch_xmanager(
                trials,
                config=config,
                module=args.module,
                title=f"{name} ({config})",
                platform=platform,
                requirements=args.xm_requirements or "",
                python=args.python,
            )
        except xm_executor.JobsFailed as error:
            console.print(f"[red]{error}[/]")
            return 1
        done = "ran" if platform in ("local", "docker") else "launched"
        console.print(f"XManager experiment {experiment_id} {done} {len(trials)} jobs")
        return 0
    except (ValueError, TypeError, FileNotFoundError, xm_executor.XManagerMissing) as error:
        print(f"launch.sweep: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
