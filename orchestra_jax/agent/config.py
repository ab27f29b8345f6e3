"""The `agent` section of an experiment config as `AgentConfig`: an episode's limits,
what the orchestrator reads each turn (`agent.context`, `agent/context.py`; the
rebuilt prompt's settings `agent.rebuild`, `RebuildConfig`) and how a turn's calls
are read and charged, checked once (`problems`). The rules that read another section
too (the context against the KV cache and the sample unit, the enum constraint
against the engine) are in training/experiment_config.py."""

from __future__ import annotations

import dataclasses

from orchestra_jax.agent.context import CONTEXT_POLICIES, ContextPolicy, context_policy
from orchestra_jax.agent.reference_turns import ACCOUNTINGS, TOOL_CALL_READINGS
from orchestra_jax.config_section import Section


@dataclasses.dataclass(frozen=True)
class RebuildConfig(Section):
    """`agent.rebuild.*`: the rebuilt prompt's parts and budgets
    (`agent/context.RebuildBudgets`). Read, and checked, only by a context policy that
    rebuilds the prompt (`AgentConfig.problems` builds the policy `agent.context`
    names), so a run of another context is not held to them."""

    SECTION = "agent.rebuild"

    system: str = "You are good at using tools. "
    instruction: str = "Choose an approriate tool."  # sic: the words the reference trains on
    doc_chars: int = 4000
    code_tokens: int = 24000
    context_tokens: int = 24000
    prompt_tokens: int = 24000
    conversation_tokens: int = 23000
    programs: str = "formatted"
    cut: str = "project"


@dataclasses.dataclass(frozen=True)
class AgentConfig(Section):
    """`agent.*`, named as in the config file (experiments/configs/grpo_hle.py says
    what each field does)."""

    SECTION = "agent"
    NESTED = {"rebuild": RebuildConfig}

    max_turns: int = 30
    max_context_tokens: int = 2048
    max_new_tokens_per_turn: int = 128
    tool_timeout_s: float = 60.0
    enable_thinking: bool = False
    seconds_per_generated_token: float = 0.0
    max_concurrent_episodes: int = 0
    context: str = "history"
    tool_calls: str = "project"
    accounting: str = "project"
    constrain_enum_arguments: bool = False
    rebuild: RebuildConfig = dataclasses.field(default_factory=RebuildConfig)

    def problems(self) -> list[str]:
        errors = self.positive(
            "max_turns", "max_context_tokens", "max_new_tokens_per_turn", "tool_timeout_s"
        )
        errors += self.positive(
            "seconds_per_generated_token", "max_concurrent_episodes", allow_zero=True
        )
        return errors + self.context_problems()

    def context_problems(self) -> list[str]:
        """How a turn's calls are read and charged (`tool_calls`, `accounting`) and the
        context policy `context` names, built from this section (`context_policy`)."""
        errors = self.choice("tool_calls", TOOL_CALL_READINGS)
        errors += self.choice("accounting", ACCOUNTINGS)
        errors += self.choice("context", CONTEXT_POLICIES)
        if errors:
            return errors
        try:
            self.context_policy()
        except (TypeError, ValueError) as e:
            return [f"agent.context={self.context!r}: {e}"]
        return []

    def context_policy(self) -> ContextPolicy:
        """The context policy `context` names, built from this section."""
        return context_policy(self)
