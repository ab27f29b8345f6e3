"""MemoizedSandbox runs each distinct program once and keeps no timed-out run."""

import concurrent.futures

import pytest

from orchestra_jax.tools.sandbox.cache import MemoizedSandbox
from orchestra_jax.tools.sandbox.registry import SandboxResult


class FakeSandbox:
    def __init__(self, time_out=()):
        self.calls = []
        self.time_out = set(time_out)

    def __call__(self, code, *, timeout_s=10.0, memory_mb=512):
        self.calls.append((code, timeout_s, memory_mb))
        timed_out = code in self.time_out
        return SandboxResult(
            stdout="" if timed_out else f"ran {code} #{len(self.calls)}\n",
            stderr="",
            exit_code=None if timed_out else 0,
            timed_out=timed_out,
            output_truncated=False,
            duration_s=0.1,
        )


def test_a_repeated_program_runs_once_and_gets_the_first_result():
    sandbox = FakeSandbox()
    run = MemoizedSandbox(sandbox)
    first = run("print(1)", timeout_s=5.0)
    again = run("print(1)", timeout_s=5.0)
    assert again is first and first.stdout == "ran print(1) #1\n"
    assert len(sandbox.calls) == 1 and (run.hits, run.misses) == (1, 1)


def test_other_code_or_other_limits_run_again():
    sandbox = FakeSandbox()
    run = MemoizedSandbox(sandbox)
    run("a", timeout_s=5.0)
    run("b", timeout_s=5.0)
    run("a", timeout_s=6.0)
    run("a", timeout_s=5.0, memory_mb=64)
    run("a", memory_mb=64, timeout_s=5.0)  # keyword order does not matter
    assert len(sandbox.calls) == 4 and run.hits == 1


def test_timed_out_runs_are_not_kept():
    sandbox = FakeSandbox(time_out={"loop()"})
    run = MemoizedSandbox(sandbox)
    assert run("loop()", timeout_s=1.0).timed_out
    assert run("loop()", timeout_s=1.0).timed_out
    assert len(sandbox.calls) == 2


def test_least_recently_used_results_are_dropped_first():
    sandbox = FakeSandbox()
    run = MemoizedSandbox(sandbox, max_entries=2)
    run("a"), run("b"), run("a"), run("c")  # "b" is the least recently used
    run("a")
    assert len(sandbox.calls) == 3
    run("b")
    assert len(sandbox.calls) == 4
    with pytest.raises(ValueError, match="max_entries"):
        MemoizedSandbox(sandbox, max_entries=0)


def test_threads_share_the_memo():
    sandbox = FakeSandbox()
    run = MemoizedSandbox(sandbox)
    run("shared")
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: run("shared" if i % 2 else f"p{i % 4}"), range(64)))
    assert {r.stdout for r in results[1::2]} == {"ran shared #1\n"}
    assert run.hits + run.misses == 65 and len(sandbox.calls) == run.misses


def test_the_offline_demo_memoizes_its_sandbox_and_the_default_does_not():
    from experiments.configs import grpo_hle
    from orchestra_jax.training import builders

    config = grpo_hle.get_config("demo")
    assert isinstance(builders.build_env(config).run_code, MemoizedSandbox)
    config.tools.memoize_code = False
    assert not isinstance(builders.build_env(config).run_code, MemoizedSandbox)
    assert not grpo_hle.get_config("qwen3_0p6b").tools.memoize_code
