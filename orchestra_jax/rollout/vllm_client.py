"""A RolloutEngine over vLLM's OpenAI server (`launch/vllm_server.sh`).

Token-in/token-out: each prompt goes out as token ids to `POST /v1/completions`
(wire format in `vllm_protocol.py`), tokens and the sampled tokens' log-probs
come back (`return_token_ids`, `logprobs`); this works with a server started
with `--skip-tokenizer-init`. Retries and errors are `http_client.py`'s; which
server a request goes to is `_pick_url`'s choice (round robin).

Weight sync, `update_weights(model, version=v)`: the weights are written as HF
safetensors in the compute (serving) dtype into `<weights_dir>/v<v>`
(`save_hf_checkpoint`), and on every server, between `POST /pause` and
`POST /resume`: `POST /collective_rpc {"method": "reload_weights", "kwargs":
{"weights_path": …}}` reloads them in place, `POST /update_weight_version` labels
them v, and `GET /weight_info` must then report v. The last two versions stay
on disk. Requests in flight: `/pause?mode=wait` lets them finish on the old
weights and new ones wait for the update (the default, so no completion mixes
versions); `abort_in_flight` ends them (`mode=abort`, finish reason "abort");
`partial` freezes them (`mode=keep`) and they continue on the new weights
after `/resume`, recording both versions (`Completion.first_weight_version`);
vLLM keeps its prefix cache then, so later requests may also reuse keys/values
computed by the older weights, as requests in flight do (`wait` and `abort`
clear it).
vLLM does not say which weights produced a completion; the version recorded is
the one this client had synced when it sent the request (and, for a request
in flight across a partial update, the one after it, whether or not the
request produced tokens before the update).

Start-up checks, before the first request or sync, on every server: it answers
(`GET /v1/models`, retried), its development endpoints are on
(`GET /server_info`: VLLM_SERVER_DEV_MODE=1, needed to reload weights), it
reports log-probs under the request's temperature (`--logprobs-mode
processed_logprobs`), and, when `model_config` is given, it serves in the
learner's compute dtype and a model of the learner's shape (its config.json,
where this process can read the served folder; otherwise the first reload and
the sync probe find a wrong shape). Each failure raises `RolloutServerError`
naming it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

from orchestra_jax.rollout import vllm_protocol as proto
from orchestra_jax.rollout.engine import Completion, GenerateRequest
from orchestra_jax.rollout.http_client import (
    HttpEngineClient,
    RefusedRequest,
    RolloutServerError,
    attempt_rid,
)
from orchestra_jax.rollout.sglang_client import as_model

log = logging.getLogger(__name__)

# Qwen3Config fields that the served model's config.json must agree on.
SHAPE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "tie_word_embeddings",
)
LOGPROBS_MODE = "processed_logprobs"


class VLLMClient(HttpEngineClient):
    """RolloutEngine over one or more vLLM servers (see the module docstring)."""

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        timeout_s: float = 600.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        weights_dir: str | None = None,
        model_config: Any = None,
        max_in_flight: int = 256,
    ):
        super().__init__(
            [urls] if isinstance(urls, str) else list(urls),
            timeout_s=timeout_s,
            max_retries=max_retries,
            backoff_s=backoff_s,
        )
        self.weights_dir = weights_dir
        self.model_config = model_config
        self.max_in_flight = max_in_flight  # requests this client keeps open at once
        self._checked = False
        self._version: int | None = None  # the weights' version this client synced last
        self._last_partial = False  # whether that sync let requests continue across it
        self._holding = 0  # syncs under way that new requests wait for

    # -- start-up checks ----------------------------------------------------------------

    async def check_servers(self) -> None:
        """The start-up checks of the module docstring, once per client."""
        if self._checked:
            return
        await asyncio.gather(*(self._check_server(u) for u in self.urls))
        self._checked = True

    async def _check_server(self, url: str) -> None:
        await self._call("GET", "/v1/models", url=url)  # up (retried), else RolloutServerError
        try:
            info = await self._request(
                "GET",
                "/server_info?config_format=json",
                url=url,
                parse=_json_object("/server_info"),
            )
        except RefusedRequest as e:
            raise RolloutServerError(
                f"{url} has no development endpoints ({e.status} on /server_info): start vLLM "
                "with VLLM_SERVER_DEV_MODE=1 (launch/vllm_server.sh) so that weights can be "
                "reloaded in place (/collective_rpc)"
            ) from None
        model = (info.get("vllm_config") or {}).get("model_config") or {}
        mode = model.get("logprobs_mode")
        if mode != LOGPROBS_MODE:
            raise RolloutServerError(
                f"{url} reports log-probs as {mode!r}: start vLLM with --logprobs-mode "
                f"{LOGPROBS_MODE} (launch/vllm_server.sh), the log_softmax(logits / T) "
                "the learner recomputes"
            )
        if self.model_config is None:
            return
        dtype = str(model.get("dtype", "")).removeprefix("torch.")
        learner = jnp.dtype(self.model_config.dtype).name
        if dtype != learner:
            raise RolloutServerError(
                f"{url} serves in {dtype or 'an unknown dtype'}, the learner computes in "
                f"{learner}: start vLLM with --dtype {learner} (DTYPE={learner} "
                "launch/vllm_server.sh)"
            )
        served = _served_config(str(model.get("model", "")))
        if served is not None:
            wrong = {
                f: (served.get(f), getattr(self.model_config, f))
                for f in SHAPE_FIELDS
                if served.get(f) != getattr(self.model_config, f)
            }
            if wrong:
                raise RolloutServerError(
                    f"{url} serves {model.get('model')!r}, whose shape differs from the "
                    "learner's (field: served, learner): "
                    + ", ".join(f"{f}: {a}, {b}" for f, (a, b) in wrong.items())
                )

    # -- RolloutEngine ------------------------------------------------------------------

    async def _generate_one(self, request: GenerateRequest, url: str | None = None) -> Completion:
        while self._holding:  # a sync is under way: wait for the new weights
            await asyncio.sleep(0.05)
        start = time.perf_counter()
        sent: list[int | None] = [None]

        def payload() -> dict[str, Any]:
            sent[0] = self._version
            return proto.completion_payload(request, attempt_rid(request.request_id))

        def completion(body: Any) -> Completion:
            return proto.completion_from_json(body, request, latency_s=time.perf_counter() - start)

        out = await self._call(
            "POST", "/v1/completions", payload, parse=completion, url=url, route=request
        )
        first, last = sent[0], self._version
        if first != last and self._last_partial:  # in flight across a partial update
            out.first_weight_version, out.weight_version = first, last
        else:
            out.weight_version = first
        return out

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        """Completions in request order; raises RolloutServerError if any request fails."""
        await self.check_servers()
        gate = asyncio.Semaphore(self.max_in_flight)

        async def one(request: GenerateRequest) -> Completion:
            async with gate:
                return await self._generate_one(request)

        return list(await asyncio.gather(*(one(r) for r in requests)))

    async def score_on_every_server(self, request: GenerateRequest) -> list[Completion]:
        """`request` answered by each server in turn (`urls` order), each completion's
        `weight_version` the one that server reports (`GET /weight_info`)."""
        await self.check_servers()
        out = []
        for url in self.urls:
            completion = await self._generate_one(request, url=url)
            completion.weight_version = await self._served_version(url)
            out.append(completion)
        return out

    async def _served_version(self, url: str) -> int | None:
        body = await self._call("GET", "/weight_info", url=url, parse=_json_object("/weight_info"))
        try:
            return int(body.get("weight_version"))
        except (TypeError, ValueError):
            return None  # vLLM's "default": never synced

    async def flush_cache(self) -> bool:
        """Ask every server to drop its prefix cache; False if one refused."""
        flushed = True
        for u in self.urls:
            try:
                body = await self._request("POST", "/reset_prefix_cache", url=u)
            except RefusedRequest as e:
                log.warning("%s did not flush its cache: %s", u, e)
                flushed = False
                continue
            flushed &= not isinstance(body, dict) or bool(body.get("success", True))
        return flushed

    async def reload_from_disk(self, path: str, *, version: int, mode: str) -> None:
        """Every server, between /pause?mode=`mode` and /resume: reload the HF weights in
        `path` in place, label them `version`, and check that it reports it."""

        async def one(url: str) -> None:
            await self._call("POST", f"/pause?mode={mode}", url=url)
            try:
                try:
                    await self._request(
                        "POST",
                        "/collective_rpc",
                        {"method": "reload_weights", "kwargs": {"weights_path": path}},
                        url=url,
                    )
                except RefusedRequest as e:
                    hint = (
                        ": start vLLM with VLLM_SERVER_DEV_MODE=1 (launch/vllm_server.sh)"
                        if e.status == 404
                        else ""
                    )
                    raise RolloutServerError(
                        f"{url} did not reload weights from {path}: {e}{hint}"
                    ) from None
                await self._call(
                    "POST", "/update_weight_version", {"new_version": str(version)}, url=url
                )
            finally:
                await self._call("POST", "/resume", url=url)
            served = await self._served_version(url)
            if served != version:
                raise RolloutServerError(
                    f"{url} reports weight version {served} after the sync to {version}"
                )

        await asyncio.gather(*(one(u) for u in self.urls))

    async def update_weights(
        self,
        model_state: Any,
        *,
        version: int,
        abort_in_flight: bool = False,
        partial: bool = False,
    ) -> None:
        """Save `model_state` (a Qwen3 model or its nnx.State) as HF weights and reload
        every server with them (see the module docstring)."""
        if abort_in_flight and partial:
            raise ValueError("update_weights: abort_in_flight and partial exclude each other")
        if self.weights_dir is None:
            raise ValueError(
                "VLLMClient needs weights_dir (a folder the servers can read) to sync weights"
            )
        from orchestra_jax.io import paths
        from orchestra_jax.models.hf_checkpoint import prune_versions, save_hf_checkpoint
        from orchestra_jax.parallel.multihost import barrier, is_primary

        await self.check_servers()
        model, config = as_model(model_state, self.model_config)
        path = paths.join(self.weights_dir, f"v{int(version)}")
        # In the compute dtype; on several hosts all gather, process 0 writes and
        # reloads the (shared) servers, the others wait for it.
        await asyncio.to_thread(save_hf_checkpoint, model, config, path, dtype=config.dtype)
        if is_primary():
            mode = "abort" if abort_in_flight else "keep" if partial else "wait"
            self._holding += int(not partial)
            try:
                await self.reload_from_disk(
                    os.fspath(paths.as_path(path)), version=int(version), mode=mode
                )
                self._version, self._last_partial = int(version), partial
            finally:
                self._holding -= int(not partial)
            prune_versions(self.weights_dir, keep=2)  # the servers' and the previous one
        barrier(f"orchestra_jax_weights_v{int(version)}")
        self._version, self._last_partial = int(version), partial  # on every host


def _served_config(folder: str) -> dict | None:
    """The served model's config.json, where this process can read its folder."""
    from orchestra_jax.io import paths

    if not folder:
        return None
    try:
        with paths.as_path(paths.join(folder, "config.json")).open() as f:
            return json.load(f)
    except (OSError, ValueError):
        log.info("cannot read %s/config.json: the served model's shape is not checked", folder)
        return None


def _json_object(what: str):
    def parse(body: Any) -> dict:
        if not isinstance(body, dict):
            raise proto.MalformedResponse(f"{what} returned {str(body)[:200]!r}, not an object")
        return body

    return parse
