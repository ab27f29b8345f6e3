"""The orchestrator's web page (`GET /`, orchestra_jax/serve/assets) in a real browser.

Headless Chromium (Debian's `chromium`; `tests/headless_chromium.py` drives it over
the DevTools protocol) loads the page from a running orchestrator server and is used
as a user would use it: clicks, typing, key presses. Skipped, saying why, without a
Chromium binary.

`test_page_in_headless_chromium`: the server's HTTP app (`OrchestratorServer`, on a
loopback port, with an API key and one request at a time) around the demo config's
evaluation world (offline experts, BM25 search) played by a scripted engine that
calls search, then a reasoner, then answers, 0.25 s a turn. The settings load only
with the right key (401s shown); a question is typed, a preference slider moved and
the question asked; each step appears before the answer, one turn at a time; the
call table and the total cost are those of the response the page read, and the same
request without streaming makes the same calls. Stop ends a run and frees its slot
on the server; a request past the server's concurrency limit shows the 429, and a
server that is gone shows a network error.

`test_page_on_the_command_line_server`: `python -m orchestra_jax.serve` as a process,
as the README runs it, with an untrained policy of the demo's shape on the JAX engine.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.request
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.headless_chromium import Chromium, Page, find_binary
from tests.live_helpers import serve_orchestrator

pytest.importorskip("websocket", reason="needs websocket-client (the `test` extra)")

CHROMIUM = find_binary()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="needs a Chromium binary (Debian: apt-get install chromium; or set $CHROMIUM)",
)

API_KEY = "page-test-key"
TURN_S = 0.25
QUESTION = "Which city is the capital of France?"
# The scripted orchestrator's turns: a tool call each; the last one answers.
SCRIPT = (
    ("search", {"model": "search-1", "query": "capital of France"}),
    ("enhance_reasoning", {"model": "reasoner-2", "problem": "Which city is the capital?"}),
    ("answer", {"model": "answer-1", "problem": QUESTION}),
)


def scripted_server():
    """The server app around the demo config's evaluation world and a scripted policy."""
    from experiments.configs import grpo_hle
    from orchestra_jax.rollout.scripted import ScriptedEngine
    from orchestra_jax.serve.app import OrchestratorServer, ServeConfig, ServerThread
    from orchestra_jax.serve.build import default_tool_config
    from orchestra_jax.serve.service import Orchestrator
    from orchestra_jax.training import builders
    from orchestra_jax.training.eval_protocols import eval_protocol

    config = grpo_hle.get_config("demo")
    test = eval_protocol(config).apply(config)
    env = builders.build_env(test)
    tokenizer = builders.build_tokenizer(test)
    turns = [
        tokenizer.encode(
            f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n"
            "</tool_call><|im_end|>"
        )
        for name, arguments in SCRIPT
    ]

    def policy(ids, request):
        del request
        # Turn t's prompt holds t earlier assistant turns and the one opened for it.
        turn = tokenizer.decode(ids).count("<|im_start|>assistant") - 1
        return turns[min(turn, len(turns) - 1)]

    orchestrator = Orchestrator(
        engine=ScriptedEngine(policy, latency_s=TURN_S),
        tokenizer=tokenizer,
        env=env,
        tool_config=default_tool_config(test, env),
        sampling=builders.eval_sampling_params(test),
        limits=builders.loop_limits(test),
        name="scripted-demo",
    )
    config = ServeConfig(max_concurrent=1, api_key=API_KEY)
    return ServerThread(OrchestratorServer(orchestrator, config))


def post_json(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def get_health(url: str) -> dict:
    request = urllib.request.Request(
        url + "/health", headers={"Authorization": f"Bearer {API_KEY}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def error_text(page: Page) -> str:
    return page.evaluate(
        "document.getElementById('error').hidden ? '' : document.getElementById('error').textContent"
    )


def set_key(page: Page, key: str) -> None:
    """Types `key` into the key field and presses Enter (the page reloads its settings)."""
    page.type_text("#api-key", key)
    page.press("Enter", 13)


def sse_events(body: str) -> list:
    """The JSON objects of a server-sent event stream's `data:` events ([DONE] last)."""
    events = []
    for block in body.split("\n\n"):
        data = "\n".join(line[6:] for line in block.splitlines() if line.startswith("data: "))
        if data:
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


# Records each node the page adds to its steps list or its answer, in order, with the
# time of the batch it came in: whether steps arrive one by one, before the answer.
WATCH = """
window.__added = [];
new MutationObserver((records) => {
  const t = performance.now();
  for (const r of records) {
    const kind = r.target.closest('#steps') ? 'step' : r.target.closest('#answer') ? 'answer' : null;
    if (kind) for (const _ of r.addedNodes) window.__added.push({t, kind});
  }
}).observe(document.getElementById('run'), {childList: true, subtree: true});
"""

CALL_ROWS = """[...document.querySelectorAll('#calls tbody tr')].map((tr) => {
  const td = tr.querySelectorAll('td');
  return {tool: td[2].textContent, model: td[3].textContent, cost: td[4].textContent,
          cost_value: Number(td[4].dataset.value), latency: td[5].textContent};
})"""


@pytest.mark.slow
def test_page_in_headless_chromium():
    with scripted_server() as server, Chromium.start(CHROMIUM) as browser:
        page = browser.page()
        page.send("Network.enable")
        page.navigate(server.url + "/")

        # Without a key the settings are refused, and the page says what to do.
        page.wait_for("!document.getElementById('error').hidden")
        assert "HTTP 401" in error_text(page) and "needs an API key" in error_text(page)
        assert page.evaluate("document.getElementById('submit').disabled")
        set_key(page, "not-the-key")
        page.wait_for(
            "document.getElementById('error').textContent.includes('refused this API key')"
        )
        set_key(page, API_KEY)
        page.wait_for("!document.getElementById('submit').disabled")
        assert error_text(page) == ""
        # Everything the page loads comes from its server (it works offline).
        loaded = {
            e["params"]["request"]["url"]
            for e in page.events
            if e["method"] == "Network.requestWillBeSent"
        }
        assert {server.url + "/", server.url + "/assets/page.js"} <= loaded
        assert all(u.startswith(server.url + "/") for u in loaded), loaded

        # Sliders from GET /v1/orchestrator's features, at its default preference.
        info = page.evaluate(
            "fetch('v1/orchestrator', {headers: {Authorization: 'Bearer "
            + API_KEY
            + "'}}).then((r) => r.json())",
            await_promise=True,
        )
        sliders = page.evaluate(
            "[...document.querySelectorAll('#preferences input[type=range]')]"
            ".map((e) => [e.dataset.feature, Number(e.value)])"
        )
        assert [f for f, _ in sliders] == info["features"]
        defaults = info["defaults"]["preference"]
        assert dict(sliders) == {f: defaults.get(f, 0.0) for f in info["features"]}

        # Type the question, drag the cost slider to near its right end, ask.
        page.type_text("#question", QUESTION)
        cost_slider = f"#pref-{info['features'].index('cost')}"
        page.click(cost_slider, at_fraction=0.97)
        cost_weight = page.evaluate(f"Number(document.querySelector('{cost_slider}').value)")
        assert cost_weight > 0.8 and cost_weight != defaults["cost"]
        page.evaluate(WATCH)
        asked = time.monotonic()
        page.click("#submit")
        # "Answered" once the stream has been read to its end.
        page.wait_for(
            "document.getElementById('status').textContent.startsWith('Answered')"
            " || !document.getElementById('error').hidden",
            timeout_s=60,
        )
        assert error_text(page) == ""
        answered_after = time.monotonic() - asked

        # The request the page sent: the key, the moved slider, streaming.
        sent = [
            e["params"]
            for e in page.events
            if e["method"] == "Network.requestWillBeSent"
            and e["params"]["request"]["url"].endswith("/v1/chat/completions")
        ]
        assert len(sent) == 1
        request = sent[0]["request"]
        body = json.loads(request["postData"])
        assert request["headers"].get("Authorization") == f"Bearer {API_KEY}"
        assert body["stream"] is True
        assert body["messages"] == [{"role": "user", "content": QUESTION}]
        assert body["preference"]["cost"] == pytest.approx(cost_weight)

        # The response the page read, as the server sent it.
        events = sse_events(
            page.send("Network.getResponseBody", requestId=sent[0]["requestId"])["body"]
        )
        assert events[-1] == "[DONE]"
        final = events[-2]
        steps = [e["orchestra_step"] for e in events[:-1] if "orchestra_step" in e]
        usage, orchestration = final["usage"], final["orchestration"]
        assert orchestration["stop_reason"] == "answer", orchestration
        assert [c["tool"] for c in usage["calls"]] == [name for name, _ in SCRIPT]

        # Steps appeared as they happened, at least one batch per turn, a turn apart,
        # all of them before the answer.
        added = page.evaluate("window.__added")
        kinds = [a["kind"] for a in added]
        assert kinds == ["step"] * len(steps) + ["answer"] * (len(kinds) - len(steps)), added
        assert "answer" in kinds
        step_times = sorted({a["t"] for a in added if a["kind"] == "step"})
        assert len(step_times) >= len(SCRIPT), f"steps did not arrive turn by turn: {added}"
        first_answer = min(a["t"] for a in added if a["kind"] == "answer")
        assert first_answer - step_times[0] >= (len(SCRIPT) - 1) * TURN_S * 1000 * 0.8, added
        shown = page.evaluate(
            "[...document.querySelectorAll('#steps li')].map((e) => e.dataset.type)"
        )
        assert shown == [s["type"] for s in steps]
        assert answered_after >= len(SCRIPT) * TURN_S

        # The answer, the total cost and the call table: the response's.
        content = "".join(
            e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e.get("choices")
        )
        assert page.evaluate("document.getElementById('answer').textContent") == content != ""
        total = page.evaluate("document.getElementById('total-cost').dataset.value")
        assert float(total) == usage["cost_usd"]
        assert page.evaluate("document.getElementById('total-cost').textContent") == (
            f"Cost ${usage['cost_usd']:.6f}"
        )
        rows = page.evaluate(CALL_ROWS)
        assert len(rows) == len(usage["calls"])
        for row, call in zip(rows, usage["calls"], strict=True):
            assert row["tool"] == call["tool"]
            assert row["model"] == (call["model"] or "–")
            assert row["cost_value"] == call["cost_usd"]
            assert row["cost"] == f"${call['cost_usd']:.6f}"
            assert row["latency"] == f"{call['latency_s']:.2f} s"

        # The same request as one JSON response makes the same calls to the same models
        # (the simulated experts' costs are drawn per request, so only their shape is
        # compared), with the fields the table shows.
        plain = post_json(server.url + "/v1/chat/completions", {**body, "stream": False})
        assert plain["orchestration"]["stop_reason"] == "answer"
        assert [(c["tool"], c["model"]) for c in plain["usage"]["calls"]] == [
            (r["tool"], r["model"]) for r in rows
        ]
        for call in plain["usage"]["calls"]:
            assert call["cost_usd"] > 0 and call["latency_s"] >= 0
        assert plain["usage"]["cost_usd"] == pytest.approx(
            sum(c["cost_usd"] for c in plain["usage"]["calls"])
            + plain["orchestration"]["orchestrator_cost_usd"]
        )

        # Stop, once the first step is shown (turns of 2 s now): the page says so, and the
        # server drops the request (the client went away), freeing its slot at once.
        server.server.orchestrator.engine.latency_s = 2.0
        page.click("#submit")
        page.wait_for("document.querySelectorAll('#steps li').length > 0")
        page.click("#stop")
        page.wait_for("document.getElementById('status').textContent === 'Stopped.'")
        assert error_text(page) == ""
        assert page.evaluate("document.getElementById('answer').textContent") == ""
        deadline = time.monotonic() + 3  # the stopped run had over 3 s left to play
        while get_health(server.url)["in_flight"]:
            assert time.monotonic() < deadline, "the stopped request still holds its slot"
            time.sleep(0.02)

        # Past the server's one request at a time: a 429, shown with its advice. The
        # slot is held by a request whose body has not all arrived yet.
        address = urlsplit(server.url)
        assert address.port is not None
        holder = socket.create_connection((address.hostname, address.port))
        try:
            holder.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b"Authorization: Bearer " + API_KEY.encode() + b"\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
            )
            deadline = time.monotonic() + 10
            while get_health(server.url)["in_flight"] < 1:
                assert time.monotonic() < deadline, "the held request never counted"
                time.sleep(0.02)
            page.click("#submit")
            page.wait_for("!document.getElementById('error').hidden")
            text = error_text(page)
            assert "HTTP 429" in text and "try again in 1 s" in text, text
            assert page.evaluate("document.getElementById('steps').childElementCount") == 0
        finally:
            holder.close()

        # The server gone: a network error, not a silent page.
        server.stop()
        page.wait_for("!document.getElementById('submit').disabled")
        page.click("#submit")
        page.wait_for(
            "document.getElementById('error').textContent.includes('could not be reached')"
        )


def export_random_demo_policy(folder) -> None:
    """The demo config's policy (its preset and shape), random, as an HF folder."""
    from flax import nnx

    from experiments.configs import grpo_hle
    from orchestra_jax.models.hf_checkpoint import save_hf_checkpoint
    from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM

    demo: Any = grpo_hle.get_config("demo")
    config = Qwen3Config.preset(demo.model.preset, **dict(demo.model.overrides))
    save_hf_checkpoint(Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)), config, folder)


def response_of(page: Page) -> list:
    """The events of the one chat completion the page asked for, as the server sent them."""
    [sent] = [
        e["params"]
        for e in page.events
        if e["method"] == "Network.requestWillBeSent"
        and e["params"]["request"]["url"].endswith("/v1/chat/completions")
    ]
    body = page.send("Network.getResponseBody", requestId=sent["requestId"])["body"]
    return [json.loads(sent["request"]["postData"]), *sse_events(body)]


@pytest.mark.slow
def test_page_on_the_command_line_server(tmp_path):
    """`python -m orchestra_jax.serve` as the README runs it, with an untrained policy
    of the demo's shape on the in-process JAX engine: the page it serves asks a
    question in one turn and shows what the server streamed."""
    export_random_demo_policy(tmp_path / "policy")
    env = {k: v for k, v in os.environ.items() if k != "ORCHESTRA_SERVE_API_KEY"}
    with serve_orchestrator(
        "experiments/configs/grpo_hle.py:demo",
        f"hf:{tmp_path / 'policy'}",
        tmp_path / "serve.log",
        env=env,
    ) as url:
        with Chromium.start(CHROMIUM) as browser:
            page = browser.page()
            page.send("Network.enable")
            page.navigate(url + "/")
            page.wait_for("!document.getElementById('submit').disabled")
            assert page.evaluate("document.getElementById('served').textContent").startswith(
                "Serving hf_policy"
            )
            page.type_text("#max-turns", "1")
            page.type_text("#question", "What is 17 * 23?")
            page.click("#submit")
            page.wait_for(
                "document.getElementById('status').textContent.startsWith('Answered')"
                " || !document.getElementById('error').hidden",
                timeout_s=240,
            )
            assert error_text(page) == ""
            body, *events = response_of(page)
            assert body["max_turns"] == 1
            assert events[-1] == "[DONE]"
            usage, orchestration = events[-2]["usage"], events[-2]["orchestration"]
            steps = [e["orchestra_step"] for e in events[:-1] if "orchestra_step" in e]
            assert [s["type"] for s in steps][:1] == ["turn"] and orchestration["turns"] == 1
            shown = page.evaluate(
                "[...document.querySelectorAll('#steps li')].map((e) => e.dataset.type)"
            )
            assert shown == [s["type"] for s in steps]
            content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1])
            assert page.evaluate("document.getElementById('answer').textContent") == content
            assert (
                float(page.evaluate("document.getElementById('total-cost').dataset.value"))
                == (usage["cost_usd"])
            )
            summary = page.evaluate("document.getElementById('summary').textContent")
            assert f"stopped: {orchestration['stop_reason']}" in summary
            assert page.evaluate("document.querySelectorAll('#calls tbody tr').length") == len(
                usage["calls"]
            )
