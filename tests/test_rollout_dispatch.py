"""Two of the project's servers behind one SGLang client: episodes stay on the server
that caches their prefix, new ones balance, a killed server's requests finish on the
other and it comes back with the current weights, weight sync reaches both at once,
and `hf:` evaluation serves the folder's weights."""

import asyncio
import json
import time

import jax
import pytest
from flax import nnx

from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.models.hf_checkpoint import save_hf_checkpoint
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.rollout.engine import GenerateRequest, SamplingParams
from orchestra_jax.rollout.http.server_pool_settings import ServerPoolSettings
from orchestra_jax.rollout.http.sglang_client import RolloutServerError, SGLangClient
from orchestra_jax.rollout.jax.engine import JaxEngine, JaxEngineConfig
from orchestra_jax.rollout.server.app import RolloutServer, ServerConfig, ServerThread, load_model
from tests.test_rollout_serving import greedy_continuation

SEQ = 1536  # the micro config's rollout.max_seq_len


class Served:
    """One server: its engine, its thread, the weight loads it timed (start, end)."""

    def __init__(self, model, config, tokenizer):
        self.config, self.tokenizer, self.loads = config, tokenizer, []
        self.engine = JaxEngine(
            model,
            JaxEngineConfig(max_batch_size=4, max_seq_len=SEQ, steps_per_call=8),
            tokenizer=tokenizer,
        )
        self.thread = self._serve(port=0)
        self.url = self.thread.url

    def _load(self, path):
        start = time.monotonic()
        state = load_model(path, like=self.config)
        time.sleep(0.3)  # long enough that loads which overlap in time are seen to
        self.loads.append((start, time.monotonic()))
        return state

    def _serve(self, port):
        server = RolloutServer(
            self.engine,
            ServerConfig(model_path="micro", tokenizer_path="demo"),
            tokenizer=self.tokenizer,
            weight_loader=self._load,
        )
        return ServerThread(server, port=port)

    def busy(self):
        return self.thread.server._in_flight > 0

    def kill(self):
        self.thread.stop(abrupt=True)

    def restart(self):
        """Back on the same port, with the weights the engine held when killed."""
        self.thread = self._serve(port=self.thread.port)


@pytest.fixture(scope="module")
def servers():
    tokenizer = load_tokenizer("demo")
    config = Qwen3Config.preset("tiny", vocab_size=4096, max_position_embeddings=4096)
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    both = [Served(model, config, tokenizer) for _ in range(2)]
    yield both, model, config
    for s in both:
        s.thread.stop()
        s.engine.close()


def run(coro):
    return asyncio.run(coro)


def episode_turns(client, prompt, key, turns, new_tokens=6):
    """Plays `turns` turns of one episode: each turn's prompt is the last one, its
    completion and two more tokens, as the agent loop's are."""

    async def play():
        ids, completions = list(prompt), []
        for t in range(turns):
            request = GenerateRequest(
                ids,
                SamplingParams(temperature=0.0, max_new_tokens=new_tokens),
                request_id=f"{key}/{t}",
                affinity_key=key,
            )
            [c] = await client.generate([request])
            completions.append(c)
            ids = ids + c.output_ids + [7, 8]
        return completions

    return play()


def prompt_of(i, length=40):
    return [100 + i] + [(11 * i + j) % 3000 + 50 for j in range(length - 1)]


@pytest.mark.slow
def test_turns_stay_on_their_server_and_new_episodes_balance(servers):
    both, _, _ = servers
    client = SGLangClient([s.url for s in both])

    async def go():
        try:
            client.take_metrics()
            played = await asyncio.gather(
                *(episode_turns(client, prompt_of(i), f"ep{i}", turns=3) for i in range(4))
            )
            return played, client.take_metrics()
        finally:
            await client.aclose()

    played, metrics = run(go())
    # Every later turn found its prefix (the last prompt and completion) in the cache of
    # the server it went to: the server that served the episode's previous turns.
    for completions in played:
        assert completions[0].cached_tokens == 0
        for previous, c in zip(completions, completions[1:]):
            assert c.cached_tokens >= previous.prompt_tokens, (previous, c)
    # Four episodes of three turns: two episodes on each server.
    assert metrics["0/requests"] == 6
    assert metrics["1/requests"] == 6
    assert metrics["0/errors"] == metrics["1/errors"] == 0
    assert metrics["0/cached_tokens"] > 0 and metrics["1/cached_tokens"] > 0
    assert metrics["0/tokens"] > 0 and metrics["0/latency_s"] > 0


def test_a_server_killed_mid_step_its_requests_finish_on_the_other_and_it_returns(
    servers, tmp_path
):
    both, model, _ = servers
    a, b = both
    client = SGLangClient(
        [a.url, b.url],
        settings=ServerPoolSettings(backoff_s=0.05, max_consecutive_errors=2, recheck_s=0.0),
        weights_dir=str(tmp_path),
    )
    requests = [
        GenerateRequest(
            prompt_of(i, 24),
            SamplingParams(temperature=0.0, max_new_tokens=64),
            request_id=f"t/{i}",
            affinity_key=f"ep{i}",
        )
        for i in range(8)
    ]

    async def go():
        try:
            client.take_metrics()
            step = asyncio.create_task(client.generate(requests))
            while not b.busy():  # b is generating its share
                await asyncio.sleep(0.01)
            await asyncio.to_thread(b.kill)
            completions = await step
            metrics = client.take_metrics()
            # A sync that b (still in, one error) cannot take: it is taken out...
            graphdef, state = nnx.split(model)
            newer = nnx.merge(graphdef, jax.tree.map(lambda x: x * 0.5, state))
            await client.update_weights(newer, version=7)
            out = dict(client.pool.down())
            # ... until it is back and has caught up.
            await asyncio.to_thread(b.restart)
            healthy = await client.health()
            return completions, metrics, out, healthy, await client.weight_versions()
        finally:
            await client.aclose()

    completions, metrics, out, healthy, versions = run(go())
    assert len(completions) == 8 and all(c.finish_reason == "length" for c in completions)
    assert all(len(c.output_ids) == 64 for c in completions)
    # b's four requests failed together, once, and went to a; one failure keeps b in.
    assert metrics["1/errors"] == metrics["1/requests"] == 4 and metrics["1/up"] == 1.0
    assert metrics["0/requests"] == 8 and metrics["0/errors"] == 0
    assert "weight sync to version 7 failed" in out[b.url] and a.url not in out
    assert healthy and client.pool.healthy() == [a.url, b.url]
    assert versions == {a.url: "7", b.url: "7"}


def test_weight_sync_reaches_both_servers_at_once_and_checks_their_versions(servers, tmp_path):
    both, model, _ = servers
    client = SGLangClient([s.url for s in both], weights_dir=str(tmp_path))
    graphdef, state = nnx.split(model)
    newer = nnx.merge(graphdef, jax.tree.map(lambda x: 0.9 * x[::-1] if x.ndim == 2 else x, state))
    prompt = [10, 20, 30]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=3)
    for s in both:
        s.loads.clear()

    async def go():
        try:
            await client.update_weights(newer, version=11)
            # One request per episode key: each server answers once.
            outs = await client.generate(
                [GenerateRequest(prompt, greedy, affinity_key=f"k{i}") for i in range(2)]
            )
            return outs, await client.weight_versions(), client.take_metrics()
        finally:
            await client.aclose()

    outs, versions, metrics = run(go())
    assert versions == {s.url: "11" for s in both}
    [(start_a, end_a)], [(start_b, end_b)] = (s.loads for s in both)
    assert max(start_a, start_b) < min(end_a, end_b)  # the loads overlapped: in parallel
    assert metrics["0/requests"] == metrics["1/requests"] == 1
    expected = greedy_continuation(newer, prompt, 3)
    assert [c.output_ids for c in outs] == [expected, expected]
    assert all(c.weight_version == 11 for c in outs)


def test_a_sync_that_no_server_takes_fails_naming_each(servers):
    both, _, _ = servers
    client = SGLangClient([s.url for s in both], settings=ServerPoolSettings(max_retries=0))

    async def go():
        try:
            await client.update_weights_from_disk("/no/such/folder", version=99)
        finally:
            await client.aclose()

    with pytest.raises(RolloutServerError, match="failed on every server") as error:
        run(go())
    assert all(s.url in str(error.value) for s in both)
    assert "could not load weights from /no/such/folder" in str(error.value)


@pytest.mark.slow
def test_hf_evaluation_serves_the_folders_weights_on_every_server(servers, tmp_path):
    from experiments.evaluate import evaluate_policies
    from tests.test_training_e2e import micro_config

    both, _, config = servers
    folder = tmp_path / "other_policy"
    other = Qwen3ForCausalLM(config, rngs=nnx.Rngs(1))  # not what the servers hold
    save_hf_checkpoint(other, config, str(folder))
    urls = ",".join(s.url for s in both)
    cfg = micro_config(
        tmp_path / "work",
        **{
            "rollout.engine": "sglang",
            "rollout.urls": urls,
            "rollout.weights_dir": str(tmp_path / "weights"),
            "eval.num_tasks": 2,
        },
    )
    before = run(_versions(urls))
    summaries = evaluate_policies(cfg, [f"hf:{folder}"])
    [summary] = summaries.values()
    version = summary["weight_version"]
    assert version == max(int(v) for v in before.values()) + 1
    assert run(_versions(urls)) == {s.url: str(version) for s in both}
    episodes = [
        json.loads(line)
        for line in (tmp_path / "work" / "trajectories" / "eval_hf_other_policy.jsonl")
        .read_text()
        .splitlines()
    ]
    turn_versions = {t["weight_version"] for e in episodes for t in e["turns"]}
    assert turn_versions == {version}
    # The version the servers report is the folder's policy: their greedy tokens are its.
    prompt = [10, 20, 30]
    client = SGLangClient(urls.split(","))

    async def greedy_everywhere():
        try:
            return await client.generate(
                [
                    GenerateRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=3))
                    for _ in both
                ]
            )
        finally:
            await client.aclose()

    expected = greedy_continuation(other, prompt, 3)
    assert [c.output_ids for c in run(greedy_everywhere())] == [expected] * len(both)


@pytest.mark.slow
def test_checkpoint_evaluation_serves_the_checkpoints_weights(servers, tmp_path):
    from experiments.evaluate import evaluate_policies
    from orchestra_jax.rollout.http.client import as_model
    from orchestra_jax.training import loop_steps
    from tests.test_training_e2e import micro_config

    both, _, _ = servers
    urls = ",".join(s.url for s in both)
    cfg = micro_config(
        tmp_path / "work",
        **{
            "rollout.engine": "sglang",
            "rollout.urls": urls,
            "rollout.weights_dir": str(tmp_path / "weights"),
            "eval.num_tasks": 2,
        },
    )
    run = loop_steps.setup_run(cfg)
    trained = jax.tree.map(lambda x: 0.7 * x, run.learner.params)  # not what servers hold
    run.learner.load_state(trained, run.learner.opt_state, step=1)
    run.checkpointer.save(
        1,
        params=run.learner.params,
        opt_state=run.learner.opt_state,
        rng=jax.random.key(cfg.seed),
        config=cfg,
        force=True,
    )
    run.checkpointer.wait_until_finished()
    policy, _ = as_model(run.learner.policy_params(), run.model_config)
    before = asyncio.run(_versions(urls))
    [summary] = evaluate_policies(cfg, ["checkpoint"]).values()
    version = summary["weight_version"]
    assert summary["steps"] == 1
    assert version == max(int(v) for v in before.values()) + 1
    assert asyncio.run(_versions(urls)) == {s.url: str(version) for s in both}
    prompt = [10, 20, 30]
    client = SGLangClient(urls.split(","))

    async def greedy():
        try:
            request = GenerateRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=3))
            return await client.generate([request, request])
        finally:
            await client.aclose()

    expected = greedy_continuation(policy, prompt, 3)
    assert [c.output_ids for c in asyncio.run(greedy())] == [expected, expected]


async def _versions(urls):
    client = SGLangClient(urls.split(","))
    try:
        return await client.weight_versions()
    finally:
        await client.aclose()


def test_evaluation_refuses_when_a_server_does_not_serve_the_pushed_version():
    from orchestra_jax.training.policy_push import PolicyNotServed, push_policy

    class LaggingServers:
        """A served engine whose second server stays on its old weights."""

        def __init__(self):
            self.loaded = None

        async def weight_versions(self):
            return {"http://a": self.loaded or "4", "http://b": "4"}

        async def update_weights(self, model_state, *, version, abort_in_flight=False):
            self.loaded = str(version)

        async def generate(self, requests):
            raise AssertionError("no request before the weights are checked")

        async def flush_cache(self):
            return True

        async def health(self):
            return True

        def close(self):
            pass

    with pytest.raises(PolicyNotServed, match="pushed as weight version 5.*http://b serves '4'"):
        run(push_policy(LaggingServers(), object(), name="hf:/x"))
