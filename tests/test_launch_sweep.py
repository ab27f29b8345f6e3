"""The sweep launcher: hyper combinators, trial naming, command lines, executors."""

import json
import pathlib
import sys

import numpy as np
import pytest
from rich.console import Console

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
# `launch/` is run from the repository root (`python -m launch.sweep`) and is not
# an installed package, so make the root importable for plain `pytest` too.
sys.path.insert(0, str(REPO_ROOT))

from launch import config_check, hyper, local_executor, sweep, trials, xm_executor  # noqa: E402

CONFIG_FILE = """
import ml_collections

def get_config(variant="demo"):
    config = ml_collections.ConfigDict()
    config.seed = 0
    config.workdir = ""
    config.rl = ml_collections.ConfigDict({"lr": 1e-6, "group_size": 8})
    config.data = ml_collections.ConfigDict({"seed": 3})
    if variant not in ("demo", "big"):
        raise ValueError(f"unknown variant {variant}")
    return config
"""


@pytest.fixture
def config_path(tmp_path):
    path = tmp_path / "cfg.py"
    path.write_text(CONFIG_FILE)
    return f"{path}:demo"


def write_sweep(tmp_path, body, name="my_sweep"):
    path = tmp_path / f"{name}.py"
    path.write_text(f"def get_sweep(hyper):\n    return {body}\n")
    return str(path)


# --- hyper ----------------------------------------------------------------------------------


def test_product_is_cartesian_with_last_factor_fastest():
    got = hyper.product([hyper.sweep("config.a", [1, 2]), hyper.sweep("config.b", ["x", "y", "z"])])
    assert len(got) == 6
    assert got[:3] == [{"config.a": 1, "config.b": v} for v in "xyz"]
    assert got[3] == {"config.a": 2, "config.b": "x"}


def test_zipit_pairs_positions_and_nests_inside_product():
    zipped = hyper.zipit([hyper.sweep("config.g", [4, 8]), hyper.sweep("config.n", [32, 16])])
    assert zipped == [{"config.g": 4, "config.n": 32}, {"config.g": 8, "config.n": 16}]
    full = hyper.product(
        [hyper.sweep("config.seed", [0, 1, 2]), zipped, hyper.fixed("config.x", True)]
    )
    assert len(full) == 6 and all(t["config.x"] is True for t in full)


def test_chain_concatenates():
    got = hyper.chain([hyper.sweep("config.a", [1]), hyper.sweep("config.b", [2, 3])])
    assert got == [{"config.a": 1}, {"config.b": 2}, {"config.b": 3}]


@pytest.mark.parametrize(
    "build, message",
    [
        (
            lambda: hyper.zipit([hyper.sweep("config.a", [1, 2]), hyper.sweep("config.b", [1])]),
            "equal length",
        ),
        (
            lambda: hyper.product([hyper.sweep("config.a", [1]), hyper.sweep("config.a", [2])]),
            "both set",
        ),
        (lambda: hyper.sweep("rl.lr", [1]), "dotted config path"),
        (lambda: hyper.sweep("config.rl-lr", [1]), "dotted config path"),
        (lambda: hyper.sweep("config.a", []), "no values"),
        (lambda: hyper.sweep("config.a", "abc"), "list of values"),
        (lambda: hyper.check_sweep({"config.a": 1}), "non-empty list"),
        (lambda: hyper.check_sweep([["config.a"]]), "not a dict"),
    ],
)
def test_bad_sweeps_raise_clear_errors(build, message):
    with pytest.raises((ValueError, TypeError), match=message):
        build()


# --- trials: values, names, workdirs, commands -----------------------------------------------


@pytest.mark.parametrize(
    "value, text",
    [
        (1e-6, "1e-06"),
        (0.5, "0.5"),
        (8, "8"),
        (True, "true"),
        (False, "false"),
        ("qwen3_8b", "qwen3_8b"),
        ((2, 4), "(2, 4)"),
        ([1], "(1,)"),
        (np.float32(0.5), "0.5"),
        (np.int64(3), "3"),
        (np.bool_(True), "true"),
    ],
)
def test_format_value(value, text):
    assert trials.format_value(value) == text


def test_format_value_rejects_unrenderable_values():
    with pytest.raises(TypeError, match="cannot pass a dict"):
        trials.format_value({"a": 1})


def test_short_keys_grow_only_where_last_parts_clash():
    names = trials.short_keys(["config.rl.lr", "config.seed", "config.data.seed", "config.rl.seed"])
    assert names == {
        "config.rl.lr": "lr",
        "config.seed": "seed",
        "config.data.seed": "data.seed",
        "config.rl.seed": "rl.seed",
    }


def test_override_string_is_file_name_safe_and_bounded():
    assert trials.override_string({"config.rl.lr": 1e-6, "config.seed": 0}) == "lr=1e-06,seed=0"
    assert trials.override_string({"config.model": "/ckpt/a b"}) == "model=-ckpt-a-b"
    long_a = trials.override_string({"config.model": "a" * 300})
    long_b = trials.override_string({"config.model": "a" * 299 + "b"})
    assert len(long_a) == trials.MAX_NAME_CHARS and long_a != long_b


def test_expand_names_workdirs_and_command_lines(config_path):
    sweep_list = hyper.product(
        [hyper.sweep("config.rl.lr", [1e-6, 3e-6]), hyper.sweep("config.seed", [0, 1, 2, 3, 4, 5])]
    )
    got = trials.expand(config_path, sweep_list, sweep_name="lrs", workdir_root="/runs/")
    assert [t.name for t in got[:2]] == ["00_lr=1e-06,seed=0", "01_lr=1e-06,seed=1"]
    assert got[11].workdir == "/runs/lrs/11_lr=3e-06,seed=5"
    assert got[0].argv == (
        "python",
        "-m",
        "experiments.grpo_hle",
        f"--config={config_path}",
        "--config.rl.lr=1e-06",
        "--config.seed=0",
        "--config.workdir=/runs/lrs/00_lr=1e-06,seed=0",
    )
    assert got[0].command.startswith("python -m experiments.grpo_hle --config=")


def test_expand_rejects_workdir_overrides_and_duplicate_trials(config_path):
    with pytest.raises(ValueError, match="config.workdir"):
        trials.expand(config_path, [{"config.workdir": "/x"}], sweep_name="s", workdir_root="/r")
    with pytest.raises(ValueError, match="trials 0 and 1"):
        trials.expand(
            config_path, [{"config.seed": 1}, {"config.seed": 1}], sweep_name="s", workdir_root="/r"
        )


def test_config_check_names_every_missing_key(config_path):
    config_check.check_overrides(config_path, ["config.rl.lr", "config.seed"])
    with pytest.raises(ValueError) as info:
        config_check.check_overrides(
            config_path, ["config.rl.learning_rate", "config.seed.x", "config.rl.lr"]
        )
    message = str(info.value)
    assert "config.rl has no field 'learning_rate'" in message and "group_size, lr" in message
    assert "config.seed.x" in message and "config.rl.lr:" not in message


# --- the command line ------------------------------------------------------------------------


def test_print_executor_prints_one_command_per_trial(tmp_path, config_path, capsys):
    path = write_sweep(tmp_path, 'hyper.sweep("config.seed", [0, 1, 2])', name="seeds")
    code = sweep.main(
        [
            f"--config={config_path}",
            f"--sweep={path}",
            f"--workdir_root={tmp_path}/runs",
            "--python=python",
        ]
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and len(lines) == 3
    assert lines[2] == (
        f"python -m experiments.grpo_hle --config={config_path} --config.seed=2 "
        f"--config.workdir={tmp_path}/runs/seeds/2_seed=2"
    )
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--max_parallel=2"], "only to --executor=local"),
        (["--xm_platform=vertex"], "only to --executor=xmanager"),
        (["--trials=0,7"], "out of range"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, config_path, capsys, extra, message):
    path = write_sweep(tmp_path, 'hyper.sweep("config.seed", [0, 1])')
    assert sweep.main([f"--config={config_path}", f"--sweep={path}", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_cli_checks_keys_against_the_config(tmp_path, config_path, capsys):
    path = write_sweep(tmp_path, 'hyper.sweep("config.rl.lrr", [1e-6])')
    assert sweep.main([f"--config={config_path}", f"--sweep={path}"]) == 2
    assert "config.rl has no field 'lrr'" in capsys.readouterr().err
    assert sweep.main([f"--config={config_path}", f"--sweep={path}", "--skip_config_check"]) == 0


def test_example_sweeps_expand():
    for name, count in (("demo_seeds", 3), ("demo_worlds", 9), ("grpo_lr_groups", 18)):
        module = trials.load_sweep_file(REPO_ROOT / "launch" / "sweeps" / f"{name}.py")
        got = trials.expand(
            module.CONFIG, module.get_sweep(hyper), sweep_name=name, workdir_root="/r"
        )
        assert len(got) == count


# --- the local executor ----------------------------------------------------------------------

# Each trial appends "start"/"end" to a shared journal, and trial k waits (up to a
# minute) until min(k + 2, 4) trials have started. With two slots that holds for
# every k, so the journal must show exactly two trials in flight at the peak; a
# serial executor would make trial 0 give up and fail. No timing is asserted.
TRIAL_SCRIPT = """
import pathlib, sys, time
seed = int(sys.argv[1]); journal = pathlib.Path(sys.argv[2])
with journal.open("a") as f: f.write(f"start {seed}\\n")
deadline = time.monotonic() + 60
while journal.read_text().count("start") < min(seed + 2, 4):
    if time.monotonic() > deadline: sys.exit(99)
    time.sleep(0.01)
with journal.open("a") as f: f.write(f"end {seed}\\n")
print(f"trial {seed} says hello")
sys.exit(3 if seed == 1 else 0)
"""


def test_local_executor_limits_concurrency_and_reports_failures(tmp_path):
    journal = tmp_path / "journal.txt"
    sweep_list = hyper.sweep("config.seed", [0, 1, 2, 3])
    planned = trials.expand("cfg.py", sweep_list, sweep_name="s", workdir_root=str(tmp_path))
    # Same trials, but each runs the tiny script instead of training.
    planned = [
        trials.Trial(
            t.index,
            t.overrides,
            t.name,
            t.workdir,
            (sys.executable, "-c", TRIAL_SCRIPT, str(t.overrides["config.seed"]), str(journal)),
        )
        for t in planned
    ]
    console = Console(file=open(tmp_path / "console.txt", "w"))
    results = local_executor.run_local(planned, max_parallel=2, console=console)

    assert [r.status for r in results] == ["ok", "failed", "ok", "ok"]
    assert [r.returncode for r in results] == [0, 3, 0, 0]
    in_flight, peak = 0, 0
    for event in journal.read_text().split("\n")[:-1]:
        in_flight += 1 if event.startswith("start") else -1
        peak = max(peak, in_flight)
    assert peak == 2
    log = pathlib.Path(results[2].log_path)
    assert log == tmp_path / "s" / "2_seed=2" / "launch.log"
    assert "trial 2 says hello" in log.read_text()
    assert (log.parent / "command.sh").read_text().endswith(planned[2].command + "\n")
    rendered = Console(file=open(tmp_path / "table.txt", "w"), width=200)
    rendered.print(local_executor.summary_table(results))
    table = (tmp_path / "table.txt").read_text()
    assert "failed" in table and "1_seed=1" in table
    assert json.dumps(results[1].to_json())  # serialisable for sweep_summary.json


def test_local_executor_reports_a_program_that_cannot_start(tmp_path):
    trial = trials.Trial(0, {}, "0", str(tmp_path / "t0"), ("/no/such/program",))
    [result] = local_executor.run_local(
        [trial], console=Console(file=open(tmp_path / "c.txt", "w"))
    )
    assert result.status == "failed" and result.returncode is None
    assert "could not start" in pathlib.Path(result.log_path).read_text()


def test_cli_local_run_writes_summary_and_exit_code(tmp_path, config_path, monkeypatch):
    # `--module` points every trial at a module that fails on seed 1: the CLI end to end.
    module_dir = tmp_path / "mods"
    module_dir.mkdir()
    (module_dir / "fake_train.py").write_text(
        "import os, sys\nsys.exit(1 if '--config.seed=1' in sys.argv and 'FIXED' not in os.environ else 0)\n"
    )
    path = write_sweep(tmp_path, 'hyper.sweep("config.seed", [0, 1])', name="two")
    argv = [
        f"--config={config_path}",
        f"--sweep={path}",
        "--executor=local",
        "--max_parallel=2",
        f"--workdir_root={tmp_path}/runs",
        "--module=fake_train",
    ]
    monkeypatch.setenv("PYTHONPATH", str(module_dir))
    assert sweep.main(argv) == 1
    summary_path = tmp_path / "runs" / "two" / "sweep_summary.json"
    summary = json.loads(summary_path.read_text())
    assert [(s["name"], s["status"]) for s in summary] == [
        ("0_seed=0", "ok"),
        ("1_seed=1", "failed"),
    ]
    # Re-running only the failed trial (now fixed) updates its entry and keeps the other.
    monkeypatch.setenv("FIXED", "1")
    assert (
        sweep.main(
            [*argv[:3], f"--workdir_root={tmp_path}/runs", "--module=fake_train", "--trials=1"]
        )
        == 0
    )
    summary = json.loads(summary_path.read_text())
    assert [(s["name"], s["status"]) for s in summary] == [("0_seed=0", "ok"), ("1_seed=1", "ok")]


# --- xmanager ----------------------------------------------------------------------------------


def test_xmanager_job_args_and_requirements():
    trial = trials.expand(
        "c.py:demo", [{"config.rl.lr": 1e-6}], sweep_name="s", workdir_root="gs://b/r"
    )[0]
    assert xm_executor.job_args(trial, "c.py:demo") == {
        "config": "c.py:demo",
        "config.rl.lr": "1e-06",
        "config.workdir": "gs://b/r/s/0_lr=1e-06",
    }
    assert xm_executor.parse_requirements("A100=8, ram=256GiB") == {"A100": 8, "ram": "256GiB"}
    assert xm_executor.install_extra({"A100": 8}) == "gpu"
    assert xm_executor.install_extra({"TPU_V3": 8}) == "tpu"
    assert xm_executor.install_extra({"cpu": 4}) == ""
    assert (
        xm_executor.docker_instructions("/src/main", "gpu")[-1]
        == "RUN pip install --no-cache-dir -e '.[gpu]'"
    )
    with pytest.raises(ValueError, match="NAME=VALUE"):
        xm_executor.parse_requirements("A100")


def test_xmanager_missing_is_a_one_line_install_hint(tmp_path, config_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "xmanager", None)  # make the import fail even if installed
    path = write_sweep(tmp_path, 'hyper.sweep("config.seed", [0])')
    assert sweep.main([f"--config={config_path}", f"--sweep={path}", "--executor=xmanager"]) == 2
    err = capsys.readouterr().err.strip()
    assert 'pip install -e ".[xm]"' in err and len(err.splitlines()) == 1


def test_xmanager_container_spec_against_the_real_api(monkeypatch):
    """The Docker / Vertex path: real xm objects, a recording stand-in experiment."""
    pytest.importorskip("xmanager")
    from xmanager import xm, xm_local

    recorded = {"jobs": []}

    class RecordingExperiment:
        experiment_id = 7

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def package(self, packageables):
            recorded["packageables"] = packageables
            return ["executable"]

        def add(self, job):
            recorded["jobs"].append(job)

    # Through the module dict: xm_local loads lazily, and getattr would import its cloud backends.
    monkeypatch.setitem(
        vars(xm_local), "create_experiment", lambda experiment_title: RecordingExperiment()
    )
    planned = trials.expand(
        "c.py:demo", hyper.sweep("config.seed", [0, 1]), sweep_name="s", workdir_root="gs://b"
    )
    got = xm_executor.launch_xmanager(
        planned,
        config="c.py:demo",
        module="experiments.grpo_hle",
        title="t",
        platform="docker",
        requirements="local_gpu=1",
        repo_root=str(REPO_ROOT),
    )
    assert got == 7
    [packageable] = recorded["packageables"]
    assert packageable.executable_spec.entrypoint == xm.ModuleName("experiments.grpo_hle")
    assert len(recorded["jobs"]) == 2
    assert recorded["jobs"][1].args.to_list(xm.utils.ARG_ESCAPER) == [
        "--config=c.py:demo",
        "--config.seed=1",
        "--config.workdir=gs://b/s/1_seed=1",
    ]


@pytest.mark.slow
def test_xmanager_local_executor_runs_a_two_job_sweep_of_the_micro_variant(
    tmp_path, monkeypatch, capsys
):
    """The real library end to end: XManager's local executor runs both trials here."""
    pytest.importorskip("xmanager")
    monkeypatch.setenv("HOME", str(tmp_path))  # XManager's experiment database
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    monkeypatch.setenv("XLA_FLAGS", "")  # one CPU device per job
    monkeypatch.chdir(REPO_ROOT)
    path = write_sweep(
        tmp_path,
        'hyper.product([hyper.fixed("config.num_steps", 1), hyper.sweep("config.seed", [0, 1])])',
    )
    argv = [
        "--config=experiments/configs/grpo_hle.py:micro",
        f"--sweep={path}",
        "--executor=xmanager",
        "--xm_platform=local",
        f"--workdir_root={tmp_path / 'runs'}",
    ]
    assert sweep.main(argv) == 0, capsys.readouterr().err
    assert "ran 2 jobs" in capsys.readouterr().err
    for seed in (0, 1):
        workdir = tmp_path / "runs" / "my_sweep" / f"{seed}_num_steps=1,seed={seed}"
        assert json.loads((workdir / "config.json").read_text())["seed"] == seed
        [record] = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
        assert record["step"] == 1
    # A failing job fails the sweep, naming the experiment.
    bad = [*argv[:-1], f"--workdir_root={tmp_path / 'bad'}", "--module=no_such_module"]
    assert sweep.main(bad + ["--skip_config_check"]) == 1
    assert "a job failed" in capsys.readouterr().err
