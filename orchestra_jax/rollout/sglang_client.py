"""A RolloutEngine over SGLang's native HTTP API (or our own `server.py`).

Token-in/token-out: prompts go out as `input_ids`, tokens and logprobs come back
from `meta_info.output_token_logprobs` (wire format in `sglang_protocol.py`), with
the `meta_info.weight_version` that generated them.

Several servers are used round robin, one batched `/generate` per chunk of at
most `max_batch_per_request` prompts, all chunks in flight at once; give a single
router URL to let SGLang's router balance instead. Retries and errors are
`http_client.py`'s: a connection error, timeout, 5xx or malformed reply (off the
wire format, an output token without a log-probability:
`sglang_protocol.MalformedResponse`) is retried on the next server, then raises
`RolloutServerError`; a 4xx raises at once.
Every attempt sends fresh request ids (`<request_id>-<random>`): SGLang refuses
an id that is still in flight, which a retried or repeated agent id would be.

Weight sync: `update_weights(model, version=v)` writes HF safetensors into
`<weights_dir>/v<version>` with `save_hf_checkpoint`, then asks every server to
`POST /update_weights_from_disk {"model_path", "weight_version", "abort_all_requests"}`;
the server waits for (or aborts) its requests in flight and flushes its own
cache, so no extra `/flush_cache` follows. The folder must be readable by the
servers: a shared disk, or a `gs://` URI (`orchestra_jax/io/paths.py`) for
servers that load from GCS (`rollout/server.py` does, through the same path
layer; SGLang itself loads local folders only).

Seeds: `sampling_seed` is sent with every seeded request, but SGLang applies it
only when launched with `--enable-deterministic-inference` (as
`launch/sglang_server.sh` does by default); otherwise its samples are not
reproducible, whatever the seed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from orchestra_jax.rollout import sglang_protocol as proto
from orchestra_jax.rollout.engine import Completion, GenerateRequest
from orchestra_jax.rollout.http_client import (
    HttpEngineClient,
    RefusedRequest,
    RolloutServerError,
    attempt_rid,
)

if TYPE_CHECKING:
    from orchestra_jax.models.qwen3 import Qwen3ForCausalLM

__all__ = ["RolloutServerError", "SGLangClient"]

log = logging.getLogger(__name__)


class SGLangClient(HttpEngineClient):
    """RolloutEngine over one or more SGLang-protocol servers."""

    def __init__(
        self,
        urls: str | Sequence[str] | None = None,
        *,
        router_url: str | None = None,
        timeout_s: float = 600.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        max_batch_per_request: int = 64,
        weights_dir: str | None = None,
        model_config: Any = None,
    ):
        if (urls is None) == (router_url is None):
            raise ValueError("give either urls (one or more servers) or router_url, not both")
        if router_url is not None:
            urls = [router_url]
        elif isinstance(urls, str):
            urls = [urls]
        super().__init__(
            list(urls or ()), timeout_s=timeout_s, max_retries=max_retries, backoff_s=backoff_s
        )
        self.max_batch_per_request = max_batch_per_request
        self.weights_dir = weights_dir
        self.model_config = model_config

    # -- RolloutEngine ----------------------------------------------------------------------

    async def _generate_chunk(
        self, chunk: Sequence[GenerateRequest], url: str | None = None
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

        return await self._call(
            "POST",
            "/generate",
            lambda: proto.generate_payload(chunk, [attempt_rid(r.request_id) for r in chunk]),
            parse=completions,
            url=url,
            route=chunk,
        )

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        """Completions in request order; raises RolloutServerError if any chunk fails."""
        n = self.max_batch_per_request
        chunks = [requests[i : i + n] for i in range(0, len(requests), n)]
        results = await asyncio.gather(*(self._generate_chunk(c) for c in chunks))
        return [c for chunk in results for c in chunk]

    async def score_on_every_server(self, request: GenerateRequest) -> list[Completion]:
        """`request` answered by each server in turn (`urls` order), each completion with
        the weight version that server reports (`meta_info.weight_version`)."""
        return [(await self._generate_chunk([request], url=u))[0] for u in self.urls]

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
        """Point every server at HF weights in `model_path` (each flushes its own cache)."""
        for u in self.urls:
            body = await self._call(
                "POST",
                "/update_weights_from_disk",
                {
                    "model_path": model_path,
                    "weight_version": str(version),
                    "abort_all_requests": abort_in_flight,
                },
                url=u,
            )
            if not (isinstance(body, dict) and body.get("success")):
                raise RolloutServerError(f"{u} refused weights from {model_path}: {body}")

    async def update_weights(
        self, model_state: Any, *, version: int, abort_in_flight: bool = False
    ) -> None:
        """Save `model_state` (a Qwen3 model or its nnx.State) as HF weights and load them."""
        if self.weights_dir is None:
            raise ValueError(
                "SGLangClient needs weights_dir (a folder the servers can read) to sync weights"
            )
        from orchestra_jax.io import paths
        from orchestra_jax.models.hf_checkpoint import prune_versions, save_hf_checkpoint
        from orchestra_jax.parallel.multihost import barrier, is_primary

        model, config = as_model(model_state, self.model_config)
        path = paths.join(self.weights_dir, f"v{int(version)}")
        # In the compute dtype; on several hosts all gather, process 0 writes and
        # points the (shared) servers at it, the others wait for it.
        await asyncio.to_thread(save_hf_checkpoint, model, config, path, dtype=config.dtype)
        if is_primary():
            await self.update_weights_from_disk(
                os.fspath(paths.as_path(path)), version=version, abort_in_flight=abort_in_flight
            )
            prune_versions(self.weights_dir, keep=2)  # the servers' and the previous one
        barrier(f"orchestra_jax_weights_v{int(version)}")


def as_model(model_state: Any, config: Any) -> tuple[Qwen3ForCausalLM, Any]:
    """(model, config) from a Qwen3 model, or from an nnx.State plus `config`."""
    from flax import nnx

    if isinstance(model_state, nnx.Module):
        return cast("Qwen3ForCausalLM", model_state), getattr(model_state, "config", config)
    if config is None:
        raise ValueError("pass model_config to SGLangClient to sync weights given as an nnx.State")
    from orchestra_jax.models.qwen3 import Qwen3ForCausalLM

    abstract = nnx.eval_shape(lambda: Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)))
    graphdef, _ = nnx.split(abstract)
    return nnx.merge(graphdef, model_state), config
