"""A RolloutEngine over SGLang's native HTTP API (or our own `server.py`).

Token-in/token-out: prompts go out as `input_ids`, tokens and logprobs come back
from `meta_info.output_token_logprobs` (wire format in `sglang_protocol.py`), with
the `meta_info.weight_version` that generated them. One batched `/generate` per
server and chunk of at most `max_batch_per_request` prompts.

Server choice (episode affinity, least load), retries on another server, health
checks, per-server metrics and the verified weight sync are `http_client.py`'s
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
local folders only (`rollout/server.py` also loads `gs://`).

Seeds: `sampling_seed` is sent with every seeded request, but SGLang applies it
only when launched with `--enable-deterministic-inference` (as
`launch/sglang_server.sh` does by default); otherwise its samples are not
reproducible, whatever the seed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from orchestra_jax.rollout import sglang_protocol as proto
from orchestra_jax.rollout.engine import Completion, GenerateRequest
from orchestra_jax.rollout.http_client import (
    HttpEngineClient,
    RefusedRequest,
    RolloutServerError,
    attempt_rid,
)
from orchestra_jax.rollout.server_pool_settings import ServerPoolSettings

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
        )

    # -- the protocol (HttpEngineClient) ----------------------------------------------------

    async def _generate_on(self, url: str, chunk: Sequence[GenerateRequest]) -> list[Completion]:
        """One batched /generate of `chunk` on `url`."""
        start = time.perf_counter()

        def completions(body: Any) -> list[Completion]:
            if not isinstance(body, list) or len(body) != len(chunk):
                raise proto.MalformedResponse(
                    f"/generate returned {type(body).__name__} for {len(chunk)} prompts: "
                    f"{str(body)[:300]}"
                )
            latency = time.perf_counter() - start
            return [proto.completion_from_json(item, latency_s=latency) for item in body]

        payload = proto.generate_payload(chunk, [attempt_rid(r.request_id) for r in chunk])
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
