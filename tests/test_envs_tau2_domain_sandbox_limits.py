"""A model-written domain tool that forks without end or takes all memory meets the
sandbox's limits: that call fails or reports the limit, the next call works, and
nothing it started outlives the domain's server.

The domain is the synthesis tests' "library" with one tool replaced
(`tests/test_envs_tau2_domain_sandbox.py` builds it), run as model-written code is:
in the domain server under bubblewrap (`envs/sandboxed_domain.py`, 64 processes
and 4 GiB of address space). Needs the `tau2` extra, ../shared/tau2-bench and
bubblewrap.
"""

import asyncio
import json
import os
import time

import pytest

from orchestra_jax.agent.tool_runner import run_call
from orchestra_jax.tools.base import ToolContext
from orchestra_jax.tools.sandbox.registry import bwrap_available
from tests.test_envs_tau2_domain_sandbox import READ, episode_and_tools, folder

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap cannot run here")

# Forks up to 400 children that sleep two minutes; without a process limit all of
# them would start (and live on the host past the test).
FORKS = """        import os, time
        started, error = 0, "none"
        for _ in range(400):
            try:
                pid = os.fork()
            except OSError as e:
                error = type(e).__name__
                break
            if pid == 0:
                time.sleep(120)
                os._exit(0)
            started += 1
        return f"started={started} error={error}"
"""

# Asks for 16 GiB, 1 GiB at a time, touching every page.
EATS = """        chunks = []
        try:
            for _ in range(16):
                chunks.append(bytearray(1 << 30))
        except MemoryError:
            return f"MemoryError after {len(chunks)} GiB"
        return f"held {len(chunks)} GiB"
"""


def processes_naming(text: str) -> list[int]:
    """Host pids whose command line contains `text`."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def call(tools, ctx, name, arguments):
    record, _ = asyncio.run(run_call(tools[name], arguments, ctx, timeout_s=60))
    return record


def test_a_tool_that_forks_without_end_is_held_to_the_process_limit(tau2_data, tmp_path):
    domain = folder(tmp_path, "forks", FORKS + READ)
    env, task, episode, tools, ctx = episode_and_tools(tau2_data, domain, trusted=False)
    forked = call(tools, ctx, "get_book_details", {"book_id": "B-1001"})
    assert forked.error is None, forked.text
    started = int(forked.text.split("started=")[1].split()[0])
    assert 0 < started < 64, forked.text  # the limit stopped it, not the loop's end
    assert "error=BlockingIOError" in forked.text, forked.text
    # The sandbox's processes, seen from the host, are bounded the same way.
    assert len(processes_naming(str(domain))) <= 64 + 2

    # The next call on the same server still works (the children hold process slots,
    # not the server): a fresh episode reads a member.
    fresh = ToolContext(task=task, state=env.reset(task))
    member = call(tools, fresh, "get_member_details", {"member_id": "M-01"})
    assert member.error is None and json.loads(member.text)["member_id"] == "M-01"

    # Closing the domain ends everything its code started.
    episode.environment.domain.close()
    deadline = time.monotonic() + 10
    while processes_naming(str(domain)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_naming(str(domain)) == []


def test_a_tool_that_takes_all_memory_meets_the_address_space_limit(tau2_data, tmp_path):
    domain = folder(tmp_path, "eats", EATS)
    env, task, episode, tools, ctx = episode_and_tools(tau2_data, domain, trusted=False)
    eaten = call(tools, ctx, "get_book_details", {"book_id": "B-1001"})
    # Either the tool sees MemoryError under the 4 GiB limit, or the server dies
    # and the call is an error; never 16 GiB held.
    assert "held" not in eaten.text, eaten.text
    if eaten.error is None:
        assert "MemoryError after" in eaten.text and int(eaten.text.split()[2]) < 4
    fresh = ToolContext(task=task, state=env.reset(task))
    member = call(tools, fresh, "get_member_details", {"member_id": "M-01"})
    assert member.error is None and json.loads(member.text)["member_id"] == "M-01"
    episode.environment.domain.close()
