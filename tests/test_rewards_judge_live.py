"""The LLM judge from config over real HTTP: prompt, exact-match shortcut, cache, cost,
retries, and a judge server that dies mid-run (retried, then the episode marked an
infrastructure failure naming it)."""

import asyncio

import pytest
from aiohttp import web

from experiments.configs import grpo_hle
from orchestra_jax.agent.trajectory import Trajectory
from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.config_section import ConfigError
from orchestra_jax.envs.synthetic import SyntheticOrchestrationEnv
from orchestra_jax.rewards import judge as judge_lib
from orchestra_jax.rollout.scripted import ScriptedEngine
from orchestra_jax.rollout.server.app import serve_in_thread
from orchestra_jax.tasks import Task
from orchestra_jax.tools.pricing import token_cost
from orchestra_jax.training import builders, rollouts

TASK = Task("frames-1", "Who painted the ceiling?", "Michelangelo", "judge", "frames")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("demo")


def judge_config(url, **fields):
    config = grpo_hle.get_config("live_tiny")
    j = config.reward.judge
    j.base_url, j.model, j.price_in, j.price_out, j.retries = url, "judge-m", 1.0, 4.0, 2
    j.max_tokens = 64
    for key, value in fields.items():
        j[key] = value
    return config


def verdict_server(tokenizer, text="I compared them. <correct>True</correct>"):
    engine = ScriptedEngine(lambda ids, req: tokenizer.encode(text) + [tokenizer.im_end_id])
    return engine, serve_in_thread(engine, tokenizer=tokenizer)


def test_judge_from_config_over_http_prompt_shortcut_cache_and_cost(tokenizer, tmp_path):
    engine, server = verdict_server(tokenizer)
    with server:
        judge = builders.build_judge(judge_config(server.url + "/v1"), str(tmp_path / "c.jsonl"))
        # An exact match (after normalisation) needs no judge call.
        same = asyncio.run(judge_lib.grade("michelangelo.", TASK, judge=judge))
        assert same.correct and not engine.requests
        verdict = asyncio.run(judge_lib.grade("Michelangelo Buonarroti", TASK, judge=judge))
        assert verdict.correct and not verdict.cached and len(engine.requests) == 1
        prompt = tokenizer.decode(engine.requests[0].input_ids)
        # The reference's layout: question, student answer, reference answer, instruction.
        order = [
            prompt.index(s)
            for s in (
                "Question: Who painted",
                "Student answer: Michelangelo Buonarroti",
                "Reference answer: Michelangelo",
                "Assume that the reference answer is correct",
            )
        ]
        assert order == sorted(order)
        completion = len(tokenizer.encode("I compared them. <correct>True</correct>")) + 1
        usage = (len(engine.requests[0].input_ids), completion)
        assert verdict.cost_usd == pytest.approx(token_cost(*usage, 1.0, 4.0))
        again = asyncio.run(judge_lib.grade("Michelangelo Buonarroti", TASK, judge=judge))
        assert again.cached and len(engine.requests) == 1
        # The cache outlives the run: a resumed run pays nothing.
        resumed = builders.build_judge(judge_config(server.url + "/v1"), str(tmp_path / "c.jsonl"))
        assert asyncio.run(judge_lib.grade("Michelangelo Buonarroti", TASK, judge=resumed)).cached
        project = builders.build_judge(
            judge_config(server.url + "/v1", prompt="project"), str(tmp_path / "p.jsonl")
        )
        asyncio.run(judge_lib.grade("Buonarroti", TASK, judge=project))
        assert "Answer to grade:" in tokenizer.decode(engine.requests[-1].input_ids)


def test_a_judge_that_answers_503_is_retried_with_backoff():
    statuses, seen = [503, 429], []

    async def handler(request):
        seen.append(await request.json())
        if statuses:
            return web.Response(status=statuses.pop(0), text="busy")
        return web.json_response(
            {
                "choices": [{"message": {"content": "<correct>False</correct>"}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 2},
            }
        )

    async def go():
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
        try:
            client = judge_lib.LLMJudge(
                __import__("orchestra_jax.tools.experts.client", fromlist=["x"]).OpenAIChatExpert(
                    url, "m", api_key_env=None, retries=2, backoff_s=0.01
                )
            )
            verdict = await judge_lib.grade("Raphael", TASK, judge=client)
            return verdict, client.client.stats
        finally:
            await runner.cleanup()

    verdict, stats = asyncio.run(go())
    assert not verdict.correct and not verdict.parse_failed and len(seen) == 3
    assert (stats.calls, stats.retries, stats.failures) == (1, 2, 0)


def test_a_judge_server_killed_mid_run_marks_the_episode_the_judges_naming_it(tokenizer, tmp_path):
    engine, server = verdict_server(tokenizer)
    judge = builders.build_judge(judge_config(server.url + "/v1"), None)
    judge.client.backoff_s = 0.05
    env = SyntheticOrchestrationEnv(0, num_entities=10)
    tasks = {t.id: t for t in (TASK, Task("frames-2", "Q2?", "Raphael", "judge", "frames"))}

    def trajectory(task_id, answer):
        return Trajectory(task_id, 0, 0, [1], [0], [0.0], 1, final_answer=answer)

    first = [trajectory("frames-1", "Leonardo")]
    asyncio.run(rollouts.grade_all(first, tasks, env, judge=judge))
    assert first[0].correct is True and len(engine.requests) == 1
    server.stop(abrupt=True)
    second = [trajectory("frames-2", "Donatello"), trajectory("frames-1", "Leonardo")]
    asyncio.run(rollouts.grade_all(second, tasks, env, judge=judge))
    failure = second[0].infra_failure  # not graded wrong in silence: marked, and not scored
    assert failure.kind == "judge" and failure.endpoint.startswith(server.url)
    assert "judge 'judge-m (reference prompt)' gave no verdict" in failure.message
    assert server.url in failure.message and "3 attempt(s)" in failure.message
    assert second[1].infra_failure is None and second[1].correct is True  # from the cache
    assert judge.client.stats.failures == 1 and judge.client.stats.retries == 2


def test_an_unreachable_judge_is_one_clear_error_at_start_up(tmp_path):
    with pytest.raises(ConfigError) as e:
        builders.build_judge(judge_config("http://127.0.0.1:9/v1"), None)
    assert str(e.value).startswith("reward.judge: the judge 'judge-m': http://127.0.0.1:9/v1 is")
    assert "unreachable" in str(e.value) and "\n" not in str(e.value)
