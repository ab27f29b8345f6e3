"""Baseline routers: fixed tool-calling plans that run through the same agent loop.

A router is a policy without a model. Given a task's `ToolConfig` it writes a
plan, a list of `(tool, alias)` calls ending with `answer`; `RouterEngine` plays
the plan back one call per turn as the exact text an orchestrator would emit,
so routers are graded, priced and logged exactly like a trained policy.

  always_strongest   search, enhance_reasoning, answer, each with the alias of
                     the highest output price (the strongest model on offer)
  always_cheapest    the same three steps with the lowest output price
  random_models      the same three steps, each with a model drawn uniformly and
                     independently from those on offer
  random_answer      always_cheapest's search and enhance_reasoning, then the
                     answer model drawn uniformly from those on offer
  direct_strongest   answer at once with the strongest answer model
  random             1 to 3 steps, uniformly random tools and aliases, then answer

For conversations (τ²), where an episode ends when the user stops, not at
`answer`, the relay routers hand every turn to one expert: they call
`ask_expert` with the chosen alias, then say exactly what the expert advised
(a tool call, or a message to the customer), and again, turn after turn. A
plan ending in the `RELAY` step repeats from its start.

  expert_strongest   ask_expert with the priciest expert, relay its advice
  expert_cheapest    the same with the cheapest expert
  expert_random      the same with one expert drawn per episode

A name joined with "+" is a mixture: each episode follows one of the named
routers, drawn uniformly (seeded), e.g. "always_cheapest+direct_strongest+random".

Routers are also the demonstrators of the warm start (`sft.demo_policy`): they
teach the call format and whole plans, while a choice that ignores the task
says nothing about which plan suits it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from orchestra_jax.chat.template import to_json
from orchestra_jax.registry import Registry
from orchestra_jax.rollout.engine import GenerateRequest
from orchestra_jax.rollout.scripted import ScriptedEngine

Plan = list[tuple[str, str]]  # (tool name, model alias)

# The three-step plan of the fixed routers, in order.
PLAN_TOOLS = ("search", "enhance_reasoning", "answer")


def tool_call_text(name: str, arguments: Mapping[str, Any]) -> str:
    """A call exactly as Qwen3's template writes an assistant `tool_calls` entry."""
    return (
        "<tool_call>\n" + to_json({"name": name, "arguments": dict(arguments)}) + "\n</tool_call>"
    )


def _by_price(config, tool: str, pick: Callable) -> str:
    aliases = config.aliases_for(tool)
    return pick(aliases, key=lambda a: (a.price_out, a.price_in)).alias


def _fixed_plan(pick: Callable) -> Callable[[Any, np.random.Generator], Plan]:
    def plan(config, rng):
        del rng
        return [
            (tool, _by_price(config, tool, pick)) for tool in PLAN_TOOLS if tool in config.tools
        ]

    return plan


def _random_alias(config, tool: str, rng: np.random.Generator) -> str:
    options = config.aliases_for(tool)
    return options[int(rng.integers(len(options)))].alias


def _random_models(config, rng) -> Plan:
    return [(tool, _random_alias(config, tool, rng)) for tool in PLAN_TOOLS if tool in config.tools]


def _random_answer(config, rng) -> Plan:
    return [
        (
            tool,
            _random_alias(config, tool, rng) if tool == "answer" else _by_price(config, tool, min),
        )
        for tool in PLAN_TOOLS
        if tool in config.tools
    ]


def _direct_strongest(config, rng) -> Plan:
    del rng
    return [("answer", _by_price(config, "answer", max))]


def _random(config, rng) -> Plan:
    steps = []
    for _ in range(int(rng.integers(0, 3))):
        tool = ("search", "enhance_reasoning")[int(rng.integers(2))]
        if tool in config.tools:
            steps.append((tool, _random_alias(config, tool, rng)))
    steps.append(("answer", _random_alias(config, "answer", rng)))
    return steps


# The step that says what the last tool returned (the expert's advice); a plan
# ending with it is played in a loop.
RELAY = "<relay>"
RELAY_TOOL = "ask_expert"


def _relay(pick: Callable | None) -> Callable[[Any, np.random.Generator], Plan]:
    def plan(config, rng):
        if pick is None:
            return [(RELAY_TOOL, _random_alias(config, RELAY_TOOL, rng)), (RELAY, "")]
        return [(RELAY_TOOL, _by_price(config, RELAY_TOOL, pick)), (RELAY, "")]

    return plan


def last_tool_response(text: str) -> str:
    """The content of the last `<tool_response>` block in `text` ("" without one)."""
    if "<tool_response>\n" not in text:
        return ""
    return text.rsplit("<tool_response>\n", 1)[1].split("\n</tool_response>", 1)[0]


# A router is `(tool_config, rng) -> Plan`; "package.module:plan_fn" names one's own.
ROUTERS: Registry[Callable[[Any, np.random.Generator], Plan]] = Registry("router")
ROUTERS.register("always_strongest", _fixed_plan(max))
ROUTERS.register("always_cheapest", _fixed_plan(min))
ROUTERS.register("random_models", _random_models)
ROUTERS.register("random_answer", _random_answer)
ROUTERS.register("direct_strongest", _direct_strongest)
ROUTERS.register("random", _random)
ROUTERS.register("expert_strongest", _relay(max))
ROUTERS.register("expert_cheapest", _relay(min))
ROUTERS.register("expert_random", _relay(None))
# The routers for conversations (their tool configurations offer `ask_expert`).
CONVERSATION_ROUTERS = ("expert_strongest", "expert_cheapest", "expert_random")


MIXTURE_SEPARATOR = "+"


def is_router(name: str) -> bool:
    """Whether `name` is a router or a "+" mixture of routers."""
    return all(ROUTERS.problem(part) is None for part in name.split(MIXTURE_SEPARATOR))


def router_parts(router: str) -> tuple[str, ...]:
    """The routers that `router` names: one, or the parts of a "+" mixture."""
    parts = tuple(router.split(MIXTURE_SEPARATOR))
    unknown = [p for p in parts if ROUTERS.problem(p) is not None]
    if unknown:
        raise ValueError(
            f"unknown router {unknown[0]!r} in {router!r}; choose from "
            f"{ROUTERS.names()}, or join several with {MIXTURE_SEPARATOR!r}"
        )
    return parts


def make_plan(router: str, tool_config, seed: int) -> Plan:
    """The plan of `router` for one episode (deterministic in `seed`)."""
    parts = router_parts(router)
    rng = np.random.default_rng(seed)
    if len(parts) > 1:
        router = parts[int(rng.integers(len(parts)))]
    return ROUTERS.get(router)(tool_config, rng)


def parse_request_id(request_id: str) -> tuple[str, int, int]:
    """`"<task id>/<group index>/<turn>"` as the agent loop writes it."""
    task_id, group, turn = request_id.rsplit("/", 2)
    return task_id, int(group), int(turn)


class RouterEngine(ScriptedEngine):
    """A `RolloutEngine` that plays each episode's router plan, one call a turn.

    Args:
      router: a name in `ROUTERS`, or a "+" mixture of them.
      tokenizer: the policy's tokenizer (calls are emitted as its token ids).
      tool_configs: task id -> the ToolConfig that episode runs with.
      seed: plans are drawn from (seed, task, group index).
    """

    def __init__(self, router: str, tokenizer, tool_configs: Mapping[str, Any], *, seed: int = 0):
        router_parts(router)  # Fails early on an unknown name.
        self.router = router
        self.tokenizer = tokenizer
        self.tool_configs = dict(tool_configs)
        self.seed = seed
        self._plans: dict[tuple[str, int], Plan] = {}
        super().__init__(self._next_call)

    def plan_for(self, task_id: str, group_index: int) -> Plan:
        key = (task_id, group_index)
        if key not in self._plans:
            config = self.tool_configs.get(task_id)
            if config is None:
                raise KeyError(f"RouterEngine has no ToolConfig for task {task_id!r}")
            seed = int(
                np.random.SeedSequence([self.seed, group_index, *task_id.encode()]).generate_state(
                    1
                )[0]
            )
            self._plans[key] = make_plan(self.router, config, seed)
        return self._plans[key]

    def _next_call(self, input_ids: Sequence[int], request: GenerateRequest) -> list[int]:
        if request.request_id is None:
            raise ValueError("RouterEngine needs request ids '<task>/<group>/<turn>'")
        task_id, group, turn = parse_request_id(request.request_id)
        plan = self.plan_for(task_id, group)
        if plan and plan[-1][0] == RELAY:
            tool, alias = plan[turn % len(plan)]
        else:
            tool, alias = plan[min(turn, len(plan) - 1)]
        if tool == RELAY:
            text = last_tool_response(self.tokenizer.decode(input_ids)) or "..."
        else:
            text = tool_call_text(tool, {"model": alias})
        return self.tokenizer.encode(text) + [self.tokenizer.im_end_id]
