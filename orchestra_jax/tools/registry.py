"""Everything a task's tools need at run time, and `make_tools` to build them.

`Backends` is what stays the same across tasks (expert clients, a retriever,
the sandbox); `ToolConfig` is what changes per task (aliases, prices).
`make_tools(tool_config, backends)` joins them into `{name: Tool}` for the
agent loop. `envs.synthetic.build_offline_backends` builds a full offline set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from orchestra_jax.tools import config as config_lib
from orchestra_jax.tools import function_tools
from orchestra_jax.tools.base import Tool
from orchestra_jax.tools.experts.client import ExpertClient
from orchestra_jax.tools.experts.protocols import PROJECT, ExpertProtocol
from orchestra_jax.tools.meta_tool_table import is_meta_tool
from orchestra_jax.tools.meta_tools import make_meta_tool
from orchestra_jax.tools.retrieval.retrievers import Retriever
from orchestra_jax.tools.retrieval.search_pricing import SearchCharge
from orchestra_jax.tools.sandbox.registry import run_python


@dataclasses.dataclass
class Backends:
    """Run-time services behind the tools.

    Attributes:
      experts: backend name (`ModelAlias.backend`) -> expert client.
      retriever: serves `search`; None disables it (calls return an error).
      run_code: `(code, *, timeout_s) -> SandboxResult`, the sandbox.
      expert_max_tokens / expert_temperature: sampling for expert calls (the
        protocol may set its own temperature).
      expert_protocol: how experts are asked and their replies read
        (`expert_protocols.EXPERT_PROTOCOLS`, `tools.experts`).
      families: backend name -> its model family (the catalogue's `family`);
        a backend not listed has family "".
      experts_for_config: optional `(tool_config) -> experts`; when set,
        `make_tools` uses its experts for that task instead of `experts`
        (simulated experts take their latencies from the task's config).
      charge_measured_time: True charges the wall time the sandbox and the
        retriever really took (code cost and latency). False charges nothing for
        it: with simulated experts, cost and latency are then functions of the
        seed alone, not of machine load, so offline rewards repeat exactly
        (a resumed run retraces an uninterrupted one).
      search_retries: extra attempts at a search the retriever failed
        (`rollout.infra_retries`), before the call is the search backend's
        failure (`orchestra_jax/infra_failure.py`).
      search_charge: what one search costs (`tools/retrieval/search_pricing.py`, `tools.search_pricing`).
    """

    experts: Mapping[str, ExpertClient]
    retriever: Retriever | None = None
    run_code: Callable[..., Any] = run_python
    expert_max_tokens: int = 2048
    expert_temperature: float = 0.0
    expert_protocol: ExpertProtocol = PROJECT
    families: Mapping[str, str] = dataclasses.field(default_factory=dict)
    experts_for_config: Callable[[Any], Mapping[str, ExpertClient]] | None = None
    charge_measured_time: bool = True
    search_retries: int = 0
    search_charge: SearchCharge = SearchCharge()

    def charged_seconds(self, measured_s: float) -> float:
        """The part of a measured wall time that is charged (see the attribute)."""
        return float(measured_s) if self.charge_measured_time else 0.0


def make_tools(tool_config: config_lib.ToolConfig, backends: Backends) -> dict[str, Tool]:
    """{tool name: Tool} for every tool enabled in `tool_config`.

    Raises ValueError when an alias names a backend that `backends` lacks, so a
    misconfigured run fails at start-up rather than mid-episode.
    """
    if backends.experts_for_config is not None:
        backends = dataclasses.replace(backends, experts=backends.experts_for_config(tool_config))
    missing = sorted(
        {a.backend for a in tool_config.aliases if a.tool in tool_config.tools}
        - set(backends.experts)
    )
    if missing:
        raise ValueError(
            f"ToolConfig aliases use backends {missing} that are not "
            f"in Backends.experts {sorted(backends.experts)}"
        )
    tools = {}
    for name in tool_config.tools:
        if is_meta_tool(name):
            tools[name] = make_meta_tool(name, tool_config, backends)
        else:
            tools[name] = function_tools.make_plain_tool(name, tool_config, backends)
    return tools
