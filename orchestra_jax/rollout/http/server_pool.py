"""Which inference server gets a request: affinity, least load, health, per-server metrics.

A `ServerPool` holds the policy and the bookkeeping, not the wire: the SGLang
client (SGLang, or the project's own `server.py`) and any other HTTP engine
client ask it where to send a request and tell it how the request went.

    url = pool.choose(affinity_key, load=tokens)   # counts the request in flight there
    try:
        ... send ...
        pool.report(url, ok=True, latency_s=..., tokens=..., cached_tokens=...)
    except ServerFault as e:
        pool.report(url, ok=False, error=str(e))
    finally:
        pool.release(url, load=tokens)             # no longer in flight

Policy:
- Affinity: a request with an `affinity_key` (one episode: `GenerateRequest.affinity_key`)
  goes to the server that served that key last, which holds its prefix in its
  cache, as long as that server is up and the caller does not avoid it.
- New keys (and requests without one) go to the least loaded server that is up:
  fewest tokens in flight, then fewest requests in flight, then fewest requests
  so far, then the first in the list. A key follows the server it was last sent
  to (so a retry elsewhere re-homes it).
- Health: `max_consecutive_errors` failed requests in a row, or `mark_down`
  (a failed health check or weight sync), take a server out; its keys are
  re-homed on their next request. A down server is due for a health check
  `recheck_s` seconds after it went down (and again every `recheck_s` while it
  stays down), a server that is up every `health_interval_s` (0: never);
  whoever checks it calls `readmit` or `mark_down` (after bringing its weights
  up to date and passing the sync probe: `HttpEngineClient._check`). Nothing
  else brings a server back: a success on a down server (tried when no server
  was up) counts, but the server stays out until its check.
- A server taken out by a failed weight sync (`mark_down(..., stale=True)`) holds
  old weights: it gets no request until `readmit`.
- No server up: requests go to the least loaded down server that is not stale,
  so a caller's retries still reach a server that comes back; with none,
  `choose` raises `NoServerAvailable` naming why each one is out.
- `forget_affinity()` drops every key's home: after a weight sync each server
  has flushed its cache, so no server holds a prefix any more.

Every method holds one lock and never blocks on I/O, so a pool can be shared by
coroutines on one event loop and by threads (an async rollout producer and the
learner's thread). Metrics: `take_metrics()` gives, per server, what happened
since its previous call (requests, tokens, errors, mean latency) and its state
now (up, in flight), keyed `<i>/<name>` by the server's place in the list.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Sequence

from orchestra_jax.infra_failure import ServiceError

log = logging.getLogger(__name__)


class NoServerAvailable(ServiceError):
    """Every server is out and none may serve (each missed a weight sync)."""


@dataclasses.dataclass
class _Window:
    """What one server did since the last `take_metrics`."""

    requests: int = 0
    errors: int = 0
    tokens: int = 0
    cached_tokens: int = 0
    latency_s: float = 0.0  # summed over the successful reports
    reports: int = 0


@dataclasses.dataclass
class ServerState:
    """One server as the pool sees it."""

    url: str
    up: bool = True
    down_reason: str = ""
    stale: bool = False  # missed a weight sync: no request until readmitted
    check_at: float = 0.0  # when it is due for a health check
    consecutive_errors: int = 0
    in_flight_requests: int = 0
    in_flight_load: int = 0
    requests_total: int = 0
    window: _Window = dataclasses.field(default_factory=_Window)


class ServerPool:
    """Routes requests over `urls` (see the module docstring)."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        max_consecutive_errors: int = 3,
        recheck_s: float = 10.0,
        health_interval_s: float = 60.0,
        max_affinity_keys: int = 1 << 16,
        clock: Callable[[], float] = time.monotonic,
    ):
        if not urls:
            raise ValueError("a server pool needs at least one url")
        if len(set(urls)) != len(urls):
            raise ValueError(f"a server pool's urls must be distinct, got {list(urls)}")
        if max_consecutive_errors < 1 or max_affinity_keys < 1:
            raise ValueError("max_consecutive_errors and max_affinity_keys must be >= 1")
        if recheck_s < 0 or health_interval_s < 0:
            raise ValueError("recheck_s and health_interval_s must be >= 0")
        self.urls = list(urls)
        self.max_consecutive_errors = max_consecutive_errors
        self.recheck_s = recheck_s
        self.health_interval_s = health_interval_s
        self.max_affinity_keys = max_affinity_keys
        self._clock = clock
        self._servers = {u: ServerState(u, check_at=self._next_check(True)) for u in self.urls}
        # affinity key -> url it was last sent to, least recently used first
        self._homes: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._lock = threading.Lock()

    # -- routing --------------------------------------------------------------------------

    def choose(
        self, affinity_key: str | None = None, *, load: int = 1, avoid: Collection[str] = ()
    ) -> str:
        """The server for one request, counted in flight there with `load` (e.g. its
        prompt plus new tokens) until `release`. `avoid`: servers this request
        already failed on; used only when no other server is up."""
        with self._lock:
            up = [s for s in self._servers.values() if s.up]
            candidates = [s for s in up if s.url not in avoid] or up
            candidates = candidates or [s for s in self._servers.values() if not s.stale]
            if not candidates:
                raise NoServerAvailable(
                    "no rollout server can serve: "
                    + "; ".join(f"{s.url}: {s.down_reason}" for s in self._servers.values())
                )
            home = self._homes.get(affinity_key) if affinity_key is not None else None
            chosen = next((s for s in candidates if s.url == home), None)
            if chosen is None:
                chosen = min(
                    candidates,
                    key=lambda s: (
                        s.in_flight_load,
                        s.in_flight_requests,
                        s.requests_total,
                        self.urls.index(s.url),
                    ),
                )
            if affinity_key is not None:
                self._homes[affinity_key] = chosen.url
                self._homes.move_to_end(affinity_key)
                while len(self._homes) > self.max_affinity_keys:
                    self._homes.popitem(last=False)
            chosen.in_flight_requests += 1
            chosen.in_flight_load += load
            chosen.requests_total += 1
            return chosen.url

    def release(self, url: str, *, load: int = 1) -> None:
        """One request `choose` sent to `url` is no longer in flight (done, failed or
        cancelled)."""
        with self._lock:
            s = self._servers[url]
            s.in_flight_requests = max(0, s.in_flight_requests - 1)
            s.in_flight_load = max(0, s.in_flight_load - load)

    def report(
        self,
        url: str,
        *,
        ok: bool,
        requests: int = 1,
        latency_s: float = 0.0,
        tokens: int = 0,
        cached_tokens: int = 0,
        error: str = "",
    ) -> None:
        """How a call of `requests` requests to `url` went: served (`ok`, in
        `latency_s`, `tokens` prompt plus generated tokens of which `cached_tokens`
        prompt tokens came from the server's cache), or failed with `error`. The
        `max_consecutive_errors`-th failure in a row takes the server out; a success
        on a down server does not bring it back (only `readmit` does)."""
        with self._lock:
            s = self._servers[url]
            w = s.window
            w.requests += requests
            if ok:
                w.tokens += tokens
                w.cached_tokens += cached_tokens
                w.latency_s += latency_s
                w.reports += 1
                s.consecutive_errors = 0
                return
            w.errors += requests
            s.consecutive_errors += 1
            if s.up and s.consecutive_errors >= self.max_consecutive_errors:
                self._mark_down(s, f"{s.consecutive_errors} failed calls in a row, last: {error}")

    # -- health ---------------------------------------------------------------------------

    def mark_down(self, url: str, reason: str, *, stale: bool = False) -> None:
        """Take `url` out (a failed health check, or with `stale` a failed weight sync:
        then it serves nothing until `readmit`); logged with `reason`."""
        with self._lock:
            s = self._servers[url]
            s.stale = s.stale or stale
            if s.up:
                self._mark_down(s, reason)
            else:
                s.down_reason = reason
                s.check_at = self._next_check(False)

    def readmit(self, url: str) -> None:
        """Put `url` back (it passed a health check and holds the current weights)."""
        with self._lock:
            s = self._servers[url]
            if not s.up:
                self._readmit(s, "passed its health check and holds the current weights")

    def healthy(self) -> list[str]:
        """The servers that are up, in list order."""
        with self._lock:
            return [u for u in self.urls if self._servers[u].up]

    def down(self) -> dict[str, str]:
        """The servers that are out, each with why."""
        with self._lock:
            return {u: s.down_reason for u, s in self._servers.items() if not s.up}

    def due_for_check(self) -> list[str]:
        """The servers whose health check is due (down ones first), each handed out once:
        it is due again `recheck_s` (down) or `health_interval_s` (up) later."""
        with self._lock:
            due = [s for s in self._servers.values() if s.check_at <= self._clock()]
            for s in due:
                s.check_at = self._next_check(s.up)
            return [s.url for s in sorted(due, key=lambda s: s.up)]

    def forget_affinity(self) -> None:
        """Every key's next request goes to the least loaded server."""
        with self._lock:
            self._homes.clear()

    def home_of(self, affinity_key: str) -> str | None:
        """The server `affinity_key` was last sent to, if remembered."""
        with self._lock:
            return self._homes.get(affinity_key)

    # -- metrics --------------------------------------------------------------------------

    def take_metrics(self) -> dict[str, float]:
        """Per server `i` (its place in `urls`), since the previous call: `i/requests`,
        `i/errors` (failed requests), `i/tokens` (prompt plus generated),
        `i/cached_tokens` (prompt tokens the server's cache supplied),
        `i/latency_s` (mean call latency); and now: `i/up` (1 or 0),
        `i/in_flight` (requests)."""
        with self._lock:
            out: dict[str, float] = {}
            for i, url in enumerate(self.urls):
                s = self._servers[url]
                w, s.window = s.window, _Window()
                out[f"{i}/requests"] = float(w.requests)
                out[f"{i}/errors"] = float(w.errors)
                out[f"{i}/tokens"] = float(w.tokens)
                out[f"{i}/cached_tokens"] = float(w.cached_tokens)
                out[f"{i}/latency_s"] = w.latency_s / w.reports if w.reports else 0.0
                out[f"{i}/up"] = float(s.up)
                out[f"{i}/in_flight"] = float(s.in_flight_requests)
            return out

    # -- under the lock -------------------------------------------------------------------

    def _mark_down(self, s: ServerState, reason: str) -> None:
        s.up, s.down_reason = False, reason
        s.check_at = self._next_check(False)
        moved = [k for k, u in self._homes.items() if u == s.url]
        for k in moved:  # re-homed on their next request
            del self._homes[k]
        left = [u for u in self.urls if self._servers[u].up]
        log.error(
            "rollout server %s taken out: %s; %d episode(s) re-homed; %d server(s) left: %s",
            s.url,
            reason,
            len(moved),
            len(left),
            left,
        )

    def _next_check(self, up: bool) -> float:
        if up:
            return self._clock() + self.health_interval_s if self.health_interval_s else math.inf
        return self._clock() + self.recheck_s

    def _readmit(self, s: ServerState, why: str) -> None:
        s.up, s.stale, s.down_reason, s.consecutive_errors = True, False, "", 0
        s.check_at = self._next_check(True)
        log.warning("rollout server %s readmitted: it %s", s.url, why)
