"""A server that was out comes back only through the sync probe of the current
weights (`HttpEngineClient._check`), and never when a weight sync began while it
was being checked: the interleavings driven step by step with events."""

import asyncio

import numpy as np

from orchestra_jax.rollout.engine import Completion, GenerateRequest
from orchestra_jax.rollout.http.client import HttpEngineClient, _Probe
from orchestra_jax.rollout.http.server_pool_settings import ServerPoolSettings

A, B = "http://a", "http://b"
EXPECTED = np.array([-1.0, -2.0, -3.0], np.float32)  # the learner's probe log-probs


class FakeServers(HttpEngineClient):
    """The protocol over in-memory servers: each holds (version label, weights); the
    probe scores `EXPECTED` on the learner's weights, shifted by 1 on any other."""

    def __init__(self):
        super().__init__([A, B], settings=ServerPoolSettings(max_retries=0, backoff_s=0.0))
        self.held = {A: ("0", "w0"), B: ("0", "w0")}
        self.learner = "w0"  # the weights the current probe was made from
        self.version_gate: dict[str, asyncio.Event] = {}  # hold a _served_version answer
        self.asked = {A: asyncio.Event(), B: asyncio.Event()}

    async def _healthy(self, url):
        return True

    async def _served_version(self, url):
        label = self.held[url][0]  # read now, answered when the gate opens
        self.asked[url].set()
        gate = self.version_gate.get(url)
        if gate is not None:
            await gate.wait()
        return label

    async def _load_on(self, url, model_path, version, *, mode):
        self.held[url] = (str(version), model_path)

    async def _score_on(self, url, request: GenerateRequest) -> Completion:
        shift = 0.0 if self.held[url][1] == self.learner else 1.0
        scores = [None, *(EXPECTED + shift).tolist()]
        return Completion([], [], "length", 4, 0, 0.0, prompt_logprobs=scores)

    async def sync(self, weights, version):
        """A weight sync that came with the learner's model: its probe, then the load."""
        self.learner = weights
        self._probe = _Probe(version, [1, 2, 3, 4], EXPECTED, 1e-3, "float32")
        await self.sync_from_disk(weights, version=version)


def test_a_sync_during_a_check_keeps_the_old_server_out_until_it_caught_up():
    async def go():
        c = FakeServers()
        await c.sync("w1", 1)
        c.pool.mark_down(A, "failed its /health check")  # out, still holding w1
        c.version_gate[A] = asyncio.Event()
        c.asked[A].clear()
        check = asyncio.create_task(c._check(A))
        await c.asked[A].wait()  # the check read A's label "1", the current version
        await c.sync("w2", 2)  # meanwhile: B takes w2, A is out (stale)
        c.version_gate[A].set()
        readmitted = await check
        during = (readmitted, c.pool.healthy(), c.held[A])
        del c.version_gate[A]
        return during, await c._check(A), c.pool.healthy(), c.held[A]

    (readmitted, healthy, held), again, after, held_after = asyncio.run(go())
    # A still holds w1: back now, it would serve them under version 2 with no probe.
    assert not readmitted and healthy == [B] and held == ("1", "w1")
    assert again and after == [A, B] and held_after == ("2", "w2")  # caught up, probed


def test_a_server_out_is_probed_even_when_its_label_is_current():
    async def go():
        c = FakeServers()
        await c.sync("w1", 1)
        c.pool.mark_down(A, "failed its /health check")
        c.held[A] = ("1", "w-restarted")  # the right label over other weights
        refused = await c._check(A), c.pool.healthy(), c.pool.down()[A]
        c.held[A] = ("1", "w1")
        return refused, await c._check(A), c.pool.healthy()

    (readmitted, healthy, why), again, after = asyncio.run(go())
    assert not readmitted and healthy == [B] and "probe" in why
    assert again and after == [A, B]
