"""launch/local_hosts.py: N local processes as the hosts of one JAX job."""

import io
import sys

import pytest

from launch import local_hosts
from orchestra_jax.parallel import distributed
from orchestra_jax.parallel.config import DistributedConfig


def test_host_env_sets_coordinator_id_and_replaces_the_device_count():
    base = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_foo=1", "A": "b"}
    env = local_hosts.host_env(base, host=1, num_hosts=3, devices_per_host=4, port=1234)
    assert env["JAX_COORDINATOR_ADDRESS"] == "127.0.0.1:1234"
    assert (env["JAX_NUM_PROCESSES"], env["JAX_PROCESS_ID"]) == ("3", "1")
    assert env["XLA_FLAGS"] == "--xla_foo=1 --xla_force_host_platform_device_count=4"
    assert env["JAX_PLATFORMS"] == "cpu" and env["A"] == "b"
    # What every host's entry point then reads.
    assert distributed.distributed_args(None, env) == distributed.DistributedArgs(
        "127.0.0.1:1234", 3, 1
    )


def _run(code, num_hosts=2):
    out = io.StringIO()
    command = [sys.executable, "-c", code]
    status = local_hosts.run_hosts(command, num_hosts=num_hosts, out=out, grace_s=2.0)
    return status, out.getvalue().splitlines()


def test_every_line_is_prefixed_with_its_host():
    status, lines = _run("import os; print('id', os.environ['JAX_PROCESS_ID']); print('bye')")
    assert status == 0
    assert sorted(lines) == ["[host 0] bye", "[host 0] id 0", "[host 1] bye", "[host 1] id 1"]


def test_one_failing_host_stops_the_others_and_sets_the_status():
    # Host 1 fails at once; host 0 would sleep for a minute if it were not stopped.
    code = (
        "import os, sys, time\n"
        "if os.environ['JAX_PROCESS_ID'] == '1': sys.exit(3)\n"
        "time.sleep(60)\n"
    )
    status, lines = _run(code)
    assert status == 3
    assert "[launcher] host 1 exited with status 3; stopping the others" in lines


def test_a_killed_host_reports_128_plus_the_signal():
    assert local_hosts.exit_status(-9) == 137 and local_hosts.exit_status(2) == 2


def test_bad_arguments_are_one_line_errors(capsys):
    assert local_hosts.main(["--num_hosts", "0", "--", "true"]) == 2
    assert local_hosts.main(["--num_hosts", "2"]) == 2
    assert "put it after `--`" in capsys.readouterr().err


def _section(values):
    """The `distributed` section of these values (None: no section)."""
    return None if values is None else DistributedConfig.from_config(values)


@pytest.mark.parametrize(
    "section, env, want",
    [
        (None, {}, None),
        ({"coordinator_address": "h:1", "num_processes": 4, "process_id": 2}, {}, ("h:1", 4, 2)),
        # Config fields left unset fall back to the environment.
        (
            {"coordinator_address": "h:1"},
            {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"},
            ("h:1", 2, 1),
        ),
        # Cluster detection: JAX fills in what is None.
        ({"auto_detect": True}, {}, (None, None, None)),
        (None, {"ORCHESTRA_JAX_DISTRIBUTED": "1"}, (None, None, None)),
        (None, {"JAX_COORDINATOR_ADDRESS": "c:9"}, ("c:9", None, None)),
    ],
)
def test_distributed_args_from_config_then_environment(section, env, want):
    got = distributed.distributed_args(_section(section), env)
    assert got == (None if want is None else distributed.DistributedArgs(*want))


@pytest.mark.parametrize(
    "section, env, message",
    [
        ({"num_processes": 2}, {}, "without a coordinator"),
        ({"coordinator_address": "h:1", "num_processes": 2, "process_id": 2}, {}, "outside"),
        (None, {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_PROCESS_ID": "x"}, "must be an integer"),
    ],
)
def test_distributed_args_errors_name_the_setting(section, env, message):
    with pytest.raises(ValueError, match=message):
        distributed.distributed_args(_section(section), env)
