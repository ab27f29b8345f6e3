"""Failures that are not the policy's: a service the episode depends on failed.

An episode is played and graded with the help of services: the engine that
generates the policy's turns, the experts and the search backend behind the
tools, the simulated user of a conversation, and the grader (an LLM judge, τ²'s
evaluator). When one of them fails for good (after its retries), the episode
says nothing about the policy, so it is marked with an `InfraFailure` and left
out of the loss and of its group's statistics (`training/rollouts.score_groups`)
and out of evaluation accuracy (`training/evaluation.py`).

The policy's own failures are not these: a malformed call, a call with bad
arguments, an unknown tool, running out of context or turns, no answer. They
stay the policy's and are trained on as before.

Kinds (`INFRA_KINDS`):

    engine           the rollout engine raised or aborted the turn
    expert           an expert endpoint failed after its client's retries
    search           the search backend failed
    judge            the LLM judge gave no verdict
    user_simulator   the other party of a conversation failed
    evaluator        τ²-bench's evaluator raised

Where a failure happens, the code raises `InfraError` (or a subclass) or builds
the record directly; the agent loop and the grader turn it into
`Trajectory.infra_failure`.

What counts as a service's failure (`is_service_failure`): the transport (a
connection refused or dropped, a timeout), the server (an HTTP error answer, a
server that stayed unreachable, a device that failed under the in-process
engine), and the project's own errors that say so (`ServiceError`: `InfraError`,
a rollout client's `RolloutServerError`, τ²'s user `PartyError`, ...). Anything
else the loop or the grader meets (a `TypeError`, a `KeyError`, an assertion, an
evaluator's `ValueError`) is a bug: it propagates with its traceback and stops the
run, never hidden as an infrastructure failure. A tool that raises is neither: it
stays an error observation the policy reads (`agent/tool_runner.py`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import urllib.error
from typing import Any

INFRA_KINDS = ("engine", "expert", "search", "judge", "user_simulator", "evaluator")


@dataclasses.dataclass(frozen=True)
class InfraFailure:
    """Why an episode is not the policy's to answer for: which kind of service
    (`INFRA_KINDS`), which endpoint of it (a URL, or the part's name where it has
    none), and the error."""

    kind: str
    endpoint: str
    message: str

    def __post_init__(self):
        if self.kind not in INFRA_KINDS:
            raise ValueError(f"infrastructure failure kind {self.kind!r} not in {INFRA_KINDS}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InfraFailure:
        return cls(kind=data["kind"], endpoint=data["endpoint"], message=data["message"])


class ServiceError(RuntimeError):
    """The project's errors that say a service failed (transport, server, timeout),
    not the caller: what `is_service_failure` recognises among them."""


class InfraError(ServiceError):
    """A service failed for good (its retries spent): raised where it failed, turned
    into the episode's `InfraFailure` by whoever plays or grades the episode."""

    def __init__(self, message: str, *, kind: str, endpoint: str):
        super().__init__(message)
        self.failure = InfraFailure(kind=kind, endpoint=endpoint, message=message)


def endpoint_of(part: Any) -> str:
    """How a service names itself in failures: its `endpoint` where it says, its
    `urls` (a rollout client's servers), `url` or `base_url` where it has one,
    else its class name."""
    endpoint = getattr(part, "endpoint", None)
    if isinstance(endpoint, str) and endpoint:
        return endpoint
    urls = getattr(part, "urls", None)
    if isinstance(urls, (list, tuple)) and urls:
        return ",".join(str(u) for u in urls)
    for attribute in ("url", "base_url"):
        value = getattr(part, attribute, None)
        if isinstance(value, str) and value:
            return value
    return type(part).__name__


# Errors of libraries the project talks to services through, by module and class:
# an error can only come from a module already imported, so none is imported here.
_LIBRARY_SERVICE_ERRORS = (
    ("aiohttp", "ClientError"),  # connection, payload and HTTP status errors
    ("openai", "APIError"),  # litellm's errors too (τ²'s user simulator and judge)
    ("jax.errors", "JaxRuntimeError"),  # the in-process engine's device failed
)


def is_service_failure(error: BaseException) -> bool:
    """Whether `error` is a service's failure (see the module docstring) rather than
    a bug: `ServiceError`, a connection error or timeout, `urllib`'s URL errors,
    and the service errors of aiohttp, openai/litellm and JAX's runtime."""
    if isinstance(
        error,
        (ServiceError, ConnectionError, TimeoutError, asyncio.TimeoutError, urllib.error.URLError),
    ):
        return True
    for module_name, class_name in _LIBRARY_SERVICE_ERRORS:
        module = sys.modules.get(module_name)
        if module is not None and isinstance(error, getattr(module, class_name)):
            return True
    return False
