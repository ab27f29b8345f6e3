"""How an HTTP rollout client treats its servers: time limits, retries, health checks.

One `ServerPoolSettings` is what `HttpEngineClient` (SGLangClient, VLLMClient)
and its `ServerPool` take; a config sets it as `rollout.server_pool.*`, one
field each (`rollout/config.ServerPoolConfig`). The meaning of each value is in
`rollout/http/client.py`'s and `rollout/http/server_pool.py`'s docstrings; in short:

- `timeout_s`: the longest one HTTP call may take (a generate call holds a whole
  chunk of requests);
- `max_retries`, `backoff_s`: a call that meets a server fault (connection
  error, timeout, 5xx, malformed reply) is retried `max_retries` times, on
  another server where one is up, after `backoff_s * 2**attempt` seconds; at
  start-up the same bound decides when a server that never answers is out;
- `max_consecutive_errors`: failed calls in a row that take a server out;
- `recheck_s`: seconds between health checks of a server that is out;
- `health_interval_s`: seconds between health checks of a server that is up
  (0: none);
- `health_timeout_s`: the longest a `/health` check may take;
- `max_in_flight`: generate calls open at once on each server (0: the
  client's own bound: every chunk for SGLang, 256 requests for vLLM); a call
  waiting for its turn is not yet timed (`timeout_s` starts when it is sent).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ServerPoolSettings:
    """The settings of the module docstring, with their defaults."""

    timeout_s: float = 600.0
    max_retries: int = 4
    backoff_s: float = 0.5
    max_consecutive_errors: int = 3
    recheck_s: float = 10.0
    health_interval_s: float = 60.0
    health_timeout_s: float = 30.0
    max_in_flight: int = 0

    def __post_init__(self):
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))

    def problems(self) -> list[str]:
        """One message per value out of its range (empty when all are valid)."""
        return settings_problems(dataclasses.asdict(self))


# field -> (lowest value, whether the lowest is allowed, whether it must be an integer)
_RANGES = {
    "timeout_s": (0.0, False, False),
    "max_retries": (0, True, True),
    "backoff_s": (0.0, True, False),
    "max_consecutive_errors": (1, True, True),
    "recheck_s": (0.0, True, False),
    "health_interval_s": (0.0, True, False),
    "health_timeout_s": (0.0, False, False),
    "max_in_flight": (0, True, True),
}


def settings_problems(values: dict, prefix: str = "") -> list[str]:
    """What is wrong with `values` as ServerPoolSettings fields (unknown names, values
    out of range), each message naming the field as `prefix + name`."""
    problems = [
        f"{prefix}{name}: no such setting (known: {', '.join(_RANGES)})"
        for name in values
        if name not in _RANGES
    ]
    for name, (low, inclusive, integer) in _RANGES.items():
        if name not in values:
            continue
        value = values[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f"{prefix}{name} must be a number, got {value!r}")
        elif integer and value != int(value):
            problems.append(f"{prefix}{name} must be an integer, got {value!r}")
        elif value < low or (value == low and not inclusive):
            problems.append(
                f"{prefix}{name} must be {'>=' if inclusive else '>'} {low}, got {value!r}"
            )
    return problems
