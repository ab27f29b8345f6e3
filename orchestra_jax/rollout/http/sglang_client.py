"""A RolloutEngine over SGLang's native HTTP API (or our own `server.py`).

Token-in/token-out: prompts go out as `input_ids`, tokens and logprobs come back
from `meta_info.output_token_logprobs` (wire format in `rollout/http/sglang_protocol.py`), with
the `meta_info.weight_version` that generated them. One batched `/generate` per
server and chunk of at most `max_batch_per_request` prompts.

Server choice (episode affinity, least load), retries on another server, health
checks, per-server metrics and the verified weight sync are `rollout/http/client.py`'s
(`HttpEngineClient`). Give a single router URL (`router_url`, or one URL) to let
SGLang's router balance instead. Every attempt sends fresh request ids
(`<request_id>-<random>`): SGLang refuses an id that is still in flight, which a
retried or repeated agent id would be. A malformed reply is one off the wire
format or with an output token without a log-probability
(`sglang_protocol.MalformedResponse`).

Weight sync on one server: `POST /update_weights_from_disk {"model_path",
"weight_version", "abort_all_requests"}`; the server waits for (or aborts) its
requests in flight and flushes its own cache, so no extra `/flush_cache`
follows; `GET /get_model_info` reports its `weight_version`. SGLang itself loads
local folders only (`rollout/server/app.py` also loads `gs://`).

Weight sync by adapter (a policy with LoRA adapters, `rollout/http/client.py`): the
server serves the base it was started with (SGLang: `--enable-lora
--max-lora-rank <r> --lora-target-modules ...`; `rollout/server/app.py`:
`--lora-rank`, `--lora-alpha`, `--lora-targets`); a sync `POST
/load_lora_adapter {"lora_name": "policy-v<v>", "lora_path": <PEFT folder>}`
and `POST /update_weight_version {"new_version", "abort_all_requests"}`, and
from then on every /generate names the adapter (`"lora_path": "policy-v<v>"`).
New requests wait while a sync is under way, so none names an adapter a server
has not loaded yet or has replaced; older adapters are unloaded (`POST
/unload_lora_adapter`), the last two kept.

Seeds: `sampling_seed` is sent with every seeded request, but SGLang applies it
only when launched with `--enable-deterministic-inference` (as
`launch/sglang_server.sh` does by default); otherwise its samples are not
reproducible, whatever the seed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from orchestra_jax.rollout.engine import Completion, GenerateRequest
from orchestra_jax.rollout.http import sglang_protocol as proto
from orchestra_jax.rollout.http.client import (
    DEFAULT_API_KEY_ENV,
    HttpEngineClient,
    RefusedRequest,
    RolloutServerError,
    adapter_name,
    attempt_rid,
)
from orchestra_jax.rollout.http.server_pool_settings import ServerPoolSettings

__all__ = ["RolloutServerError", "SGLangClient"]

log = logging.getLogger(__name__)


class SGLangClient(HttpEngineClient):
    """RolloutEngine over one or more SGLang-protocol servers."""

    def __init__(
        self,
        urls: str | Sequence[str] | None = None,
        *,
        router_url: str | None = None,
        settings: ServerPoolSettings | None = None,
        max_batch_per_request: int = 64,
        weights_dir: str | None = None,
        model_config: Any = None,
        sync_tolerance: float | None = None,
        api_key_env: str | None = DEFAULT_API_KEY_ENV,
        max_context_tokens: int | None = None,
    ):
        if (urls is None) == (router_url is None):
            raise ValueError("give either urls (one or more servers) or router_url, not both")
        super().__init__(
            [router_url] if router_url is not None else urls,
            settings=settings,
            max_batch_per_request=max_batch_per_request,
            weights_dir=weights_dir,
            model_config=model_config,
            sync_tolerance=sync_tolerance,
            api_key_env=api_key_env,
            max_context_tokens=max_context_tokens,
        )

        self._synced: int | None = None  # the weights' version this client synced last

    # -- the protocol (HttpEngineClient) ----------------------------------------------------

    async def _generate_on(self, url: str, chunk: Sequence[GenerateRequest]) -> list[Completion]:
        """One batched /generate of `chunk` on `url`; with LoRA, after any sync under way,
        naming the adapter synced last."""
        while self.lora is not None and self._syncing:
            await asyncio.sleep(0.05)
        return await self._generate_with(url, chunk, self.served_adapter(self._synced))

    async def _score_on(self, url: str, request: GenerateRequest) -> Completion:
        # The sync's own probe does not wait for it, and names the adapter it verifies.
        version = self._probe.version if self._probe is not None else self._synced
        return (await self._generate_with(url, [request], self.served_adapter(version)))[0]

    async def _generate_with(
        self, url: str, chunk: Sequence[GenerateRequest], adapter: str | None
    ) -> list[Completion]:
        start = time.perf_counter()

        def completions(body: Any) -> list[Completion]:
            if not isinstance(body, list) or len(body) != len(chunk):
                raise proto.MalformedResponse(
                    f"/generate returned {type(body).__name__} for {len(chunk)} prompts: "
                    f"{str(body)[:300]}"
                )
            latency = time.perf_counter() - start
            return [proto.completion_from_json(item, latency_s=latency) for item in body]

        rids = [attempt_rid(r.request_id) for r in chunk]
        payload = proto.generate_payload(chunk, rids, lora_path=adapter)
        return await self._send("POST", url, "/generate", payload, parse=completions)

    async def _served_version(self, url: str) -> str | None:
        info = await self._call("GET", "/get_model_info", url=url)  # also SGLang's router's
        version = info.get("weight_version") if isinstance(info, dict) else None
        return None if version is None else str(version)

    async def _load_on(self, url: str, model_path: str, version: int, *, mode: str) -> None:
        if mode not in ("wait", "abort"):
            raise ValueError(f"SGLangClient loads weights waiting or aborting, not {mode!r}")
        body = await self._call(
            "POST",
            "/update_weights_from_disk",
            {
                "model_path": model_path,
                "weight_version": str(version),
                "abort_all_requests": mode == "abort",
            },
            url=url,
        )
        if not (isinstance(body, dict) and body.get("success")):
            raise RolloutServerError(f"{url} refused weights from {model_path}: {body}")

    async def _load_adapter_on(self, url: str, adapter_path: str, version: int, *, mode: str):
        if mode not in ("wait", "abort"):
            raise ValueError(f"SGLangClient loads adapters waiting or aborting, not {mode!r}")
        name = adapter_name(version)
        try:
            body = await self._request(
                "POST",
                "/load_lora_adapter",
                {"lora_name": name, "lora_path": adapter_path},
                url=url,
            )
        except RefusedRequest as e:
            raise RolloutServerError(
                f"{url} did not load adapter {name} from {adapter_path}: {e} (SGLang: start it "
                "with --enable-lora; rollout/server/app.py: with --lora-rank)"
            ) from None
        if not (isinstance(body, dict) and body.get("success")):
            raise RolloutServerError(f"{url} refused adapter {name} from {adapter_path}: {body}")
        await self._call(
            "POST",
            "/update_weight_version",
            {"new_version": str(version), "abort_all_requests": mode == "abort"},
            url=url,
        )

    async def _unload_adapter_on(self, url: str, name: str) -> None:
        await self._request("POST", "/unload_lora_adapter", {"lora_name": name}, url=url)

    async def sync_from_disk(self, model_path: str, *, version: int, mode: str = "wait") -> None:
        await super().sync_from_disk(model_path, version=version, mode=mode)
        self._synced = int(version)

    # -- SGLang's own endpoints -------------------------------------------------------------

    async def get_model_info(self) -> list[dict]:
        return [await self._call("GET", "/model_info", url=u) for u in self.urls]

    async def flush_cache(self) -> bool:
        """Ask every server to drop its prefix cache; False if one refused (SGLang does
        while requests run: a race with other clients, not an error)."""
        flushed = True
        for u in self.urls:
            try:
                await self._request("POST", "/flush_cache", url=u)
            except RefusedRequest as e:
                log.warning("%s did not flush its cache: %s", u, e)
                flushed = False
        return flushed

    async def update_weights_from_disk(
        self, model_path: str, *, version: int, abort_in_flight: bool = False
    ) -> None:
        """Point every server at HF weights already in `model_path` (`sync_from_disk`; the
        version check only: there is no model to probe with)."""
        await self.sync_from_disk(
            model_path, version=version, mode="abort" if abort_in_flight else "wait"
        )
