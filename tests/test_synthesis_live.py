"""The synthesis pipeline's transport against a real endpoint: the project's server
hosting a random tiny model (one per module), behind a proxy that records the
traffic and answers the first request with a 503.

The request goes out as an OpenAI chat completion, the 503 is retried, tokens
and cost are those the server reported at the catalogue's prices, and the
random model's outputs are rejected with their reasons (the stage then fails,
and says so in the report) rather than crashing the run. A dead endpoint is
retried, then reported. Needs the `tau2` extra and ../shared/tau2-bench.
"""

import json

import pytest
from aiohttp import web

from experiments.configs import synthesize as synthesize_configs
from orchestra_jax.synthesis.pipeline import synthesize
from orchestra_jax.synthesis.stages import StageFailed
from tests.live_helpers import RecordingProxy, free_port, start_server, wait_until_serving

PRICE_IN, PRICE_OUT = 3.0, 15.0


class FlakyProxy(RecordingProxy):
    """A recording proxy whose first chat request gets a 503."""

    failed = 0

    async def _forward(self, request):
        if request.path.endswith("/chat/completions") and not self.failed:
            self.failed += 1
            await request.read()
            self.records.append({"method": "POST", "path": request.path, "status": 503})
            return web.Response(status=503, text="busy")
        return await super()._forward(request)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("server")
    port = free_port()
    process = start_server(port, log_path=str(tmp / "server.log"))
    try:
        wait_until_serving(f"http://127.0.0.1:{port}", process, timeout_s=300)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=60)


def config_for(tmp_path, tau2_data, base_url, *, retries=2):
    catalogue = tmp_path / "models.yaml"
    catalogue.write_text(
        json.dumps(
            {
                "models": [
                    {
                        "name": "tiny",
                        "model": "tiny",
                        "base_url": base_url,
                        "api_key_env": None,
                        "price_in": PRICE_IN,
                        "price_out": PRICE_OUT,
                        "latency_s": 1,
                        "roles": ["answer"],
                    }
                ]
            }
        )
    )
    c = synthesize_configs.get_config("live_tiny")
    c.generator.catalogue = str(catalogue)
    c.generator.model = "tiny"
    c.generator.retries = retries
    c.generator.timeout_s = 300.0
    c.out_dir = str(tmp_path / "out")
    c.tau2_data_dir = str(tau2_data)
    c.max_tokens = 24
    return c


def test_requests_retries_cost_and_rejected_outputs(server, tau2_data, tmp_path):
    proxy = FlakyProxy(server)
    try:
        config = config_for(tmp_path, tau2_data, proxy.url + "/v1")
        with pytest.raises(StageFailed, match="schema"):
            synthesize(config)
    finally:
        proxy.close()
    chats = proxy.chat_records()
    assert [r["status"] for r in chats] == [503, 200, 200]  # retried, then two attempts
    request = chats[1]["request"]
    assert request["model"] == "tiny" and request["max_tokens"] == 24
    assert [m["role"] for m in request["messages"]] == ["system", "user"]
    assert "library" in request["messages"][1]["content"]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    schema = report["stages"]["schema"]
    assert schema["kept"] == 0 and sum(schema["rejected"].values()) == 2
    assert set(schema["rejected"]) <= {"invalid_json", "schema_mismatch"}
    assert "no valid output" in report["failed"]
    usage = [r["response"]["usage"] for r in chats[1:]]
    prompt = sum(u["prompt_tokens"] for u in usage)
    completion = sum(u["completion_tokens"] for u in usage)
    assert schema["usage"]["prompt_tokens"] == prompt > 0
    assert schema["usage"]["completion_tokens"] == completion > 0
    expected = (prompt * PRICE_IN + completion * PRICE_OUT) / 1e6
    assert schema["usage"]["cost_usd"] == pytest.approx(expected)
    assert len(list((tmp_path / "out" / "calls").glob("*.json"))) == 2


def test_a_dead_endpoint_is_retried_then_reported(tau2_data, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}/v1"
    config = config_for(tmp_path, tau2_data, dead, retries=1)
    with pytest.raises(StageFailed):
        synthesize(config)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    schema = report["stages"]["schema"]
    assert schema["rejected"] == {"generator_failed": 2}  # both attempts, each retried once
    assert "after 2 attempt(s)" in schema["reject_examples"]["generator_failed"][0]
    assert schema["usage"]["failed_calls"] == 2 and schema["usage"]["paid_calls"] == 0
    assert not list((tmp_path / "out" / "calls").glob("*.json"))  # nothing stored: retried next run
