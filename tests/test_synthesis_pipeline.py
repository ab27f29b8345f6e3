"""The synthesis pipeline end to end on a scripted generator (tests/synthesis_script.py).

A whole new domain ("library") is built, its tasks made and evolved: the valid
outputs are kept and every invalid one (malformed JSON, a tool that raises, a
task whose gold action fails, entries the data model refuses, …) is rejected
with its reason. A run killed mid-way and started again pays for no call
twice and ends where an uninterrupted run ends. The tasks file reads back
through the ToolScale reader and its tasks play in the τ² environment, graded
by tau2. Needs the `tau2` extra and ../shared/tau2-bench (skipped without).
"""

import asyncio
import json

import pytest

from experiments.configs import synthesize as synthesize_configs
from orchestra_jax.synthesis.generator import Call, ScriptedGenerator
from orchestra_jax.synthesis.pipeline import run, synthesize
from tests import synthesis_script as script


def config_for(out_dir, tau2_data):
    c = synthesize_configs.get_config("new_domain")
    c.generator.kind = "scripted"
    c.out_dir = str(out_dir)
    c.tau2_data_dir = str(tau2_data)
    c.domain.entry_focuses = "a central branch,a suburban branch,a mobile library"
    c.tasks.num_purposes = 2
    c.tasks.samples_per_purpose = 2
    c.attempts = 2
    c.max_concurrency = 2
    return c


@pytest.fixture(scope="module")
def result(tau2_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    generator = ScriptedGenerator(script.REPLIES, price_in=1.0, price_out=2.0)
    return synthesize(config_for(out, tau2_data), generator), generator, out


def test_valid_outputs_are_kept_and_each_invalid_one_rejected_with_its_reason(result):
    res, generator, out = result
    stages = res.report["stages"]
    for stage, (kept, rejected) in script.EXPECTED.items():
        assert stages[stage]["kept"] == kept, stage
        assert stages[stage]["rejected"] == rejected, stage
    assert [t["id"] for t in res.tasks] == script.KEPT_TASKS
    assert sorted(generator.calls) == sorted(script.REPLIES)  # every reply asked for once
    report_md = (out / "report.md").read_text()
    assert "tool_raises 1" in report_md and "`gold_action_fails`:" in report_md
    detail = stages["tasks"]["reject_examples"]["gold_action_fails"][0]
    assert "library-000-1" in detail and "B-9999" in detail


def test_tokens_and_cost_are_accounted(result):
    res, generator, _ = result
    totals = res.report["totals"]
    assert totals["paid_calls"] == len(script.REPLIES) and totals["reused_calls"] == 0
    # The scripted generator counts words; check one call by hand.
    call = Call("policy", "policy/1", ({"role": "user", "content": "a b c"},))
    reply = asyncio.run(
        ScriptedGenerator(script.REPLIES, price_in=1.0, price_out=2.0).generate(call)
    )
    assert reply.prompt_tokens == 3 and reply.completion_tokens == len(script.POLICY.split())
    assert reply.cost_usd == pytest.approx((3 * 1.0 + reply.completion_tokens * 2.0) / 1e6)
    expected = (totals["prompt_tokens"] * 1.0 + totals["completion_tokens"] * 2.0) / 1e6
    assert totals["cost_usd"] == pytest.approx(expected)


def test_the_domain_folder_is_complete(result):
    res, _, _ = result
    folder = res.domain_folder
    assert sorted(p.name for p in folder.iterdir()) == [
        "data_model.py",
        "db.json",
        "policy.md",
        "schema.json",
        "tasks.json",
        "tools.py",
    ]
    assert json.loads((folder / "db.json").read_text())["books"].keys() == {"B-1001", "B-1002"}
    assert "self.db.inventory" not in (folder / "tools.py").read_text()  # the kept kit


class Killed(BaseException):
    """Stands for the process being killed (not an error a stage would count)."""


class KilledAfter(ScriptedGenerator):
    def __init__(self, n, **kwargs):
        super().__init__(script.REPLIES, **kwargs)
        self.n = n

    async def generate(self, call):
        if len(self.calls) >= self.n:
            raise Killed
        return await super().generate(call)


def test_a_killed_run_resumes_without_repeating_a_call(result, tau2_data, tmp_path):
    config = config_for(tmp_path, tau2_data)
    first = KilledAfter(9)  # dies during the tools stage
    with pytest.raises(Killed):
        asyncio.run(run(config, first))
    stored = len(list((tmp_path / "calls").glob("*.json")))
    assert stored == 9  # every answered call was stored before it was used
    second = ScriptedGenerator(script.REPLIES)
    resumed = asyncio.run(run(config, second))
    assert not set(first.calls[:9]) & set(second.calls)
    assert sorted(first.calls[:9] + second.calls) == sorted(script.REPLIES)
    assert resumed.report["totals"]["reused_calls"] == 9
    assert resumed.tasks == result[0].tasks  # the same tasks as the uninterrupted run
    third = ScriptedGenerator({})  # a finished run, started again: no call at all
    again = asyncio.run(run(config, third))
    assert third.calls == [] and again.tasks == resumed.tasks


def test_the_tasks_read_back_through_the_toolscale_reader_and_play(result, tau2_data):
    from orchestra_jax.data.readers import read_tasks
    from orchestra_jax.envs.tau2.env import Tau2Environment, scripted_user_factory
    from orchestra_jax.tools.base import ToolContext

    res, _, _ = result
    tasks, report = read_tasks("toolscale", res.tasks_file)
    assert report.malformed == 0 and [t.id for t in tasks] == [
        f"tau2/library/{i}" for i in script.KEPT_TASKS
    ]
    assert tasks[0].metadata["source"] == "toolscale"
    env = Tau2Environment(scripted_user_factory, data_dir=tau2_data, domain=str(res.domain_folder))
    assert [t.id for t in env.tasks("base", 10)] == [t.id for t in tasks]  # the folder's copy
    for task, gold_ok in ((tasks[0], True), (tasks[0], False)):
        episode = env.reset(task)
        tools = env.tools(env.tool_config_sampler(seed=0).sample(task), task=task)
        ctx = ToolContext(task=task, state=episode)
        actions = task.metadata["tau2_task"]["evaluation_criteria"]["actions"]
        for action in actions if gold_ok else actions[:1]:  # without the write
            out = asyncio.run(tools[action["name"]](action["arguments"], ctx))
            assert out.error is None, out.text
        episode.record_agent_calls()
        episode.termination = "user_stop"
        verdict = asyncio.run(env.grade(task, None, state=episode))
        assert verdict.info["breakdown"]["DB"] == (1.0 if gold_ok else 0.0)
