"""The model-backed meta-tools, one table entry each.

A meta-tool has one argument, `model`, naming an alias of the task's
`ToolConfig` (`search-1`, `reasoner-2`, …); the alias's backend, an expert
model, does the work in the tool's role. Everything that tells meta-tools apart
is an entry of `META_TOOLS`:

  name              the tool's name in the schema ("search")
  alias_prefix      its models are named "<prefix>-1", "<prefix>-2", …
  role              the expert's role ("query"), recovered from its prompt by
                    simulated experts (`prompts.role_of`)
  role_prompt       the expert's system prompt in that role
  description       the tool's description in the schema
  argument_wording  "The model used to <argument_wording>." (the `model` argument)
  result            what becomes of the expert's reply (`meta_tools.py`):
                    "documents" (a query, run against the retriever), "code" (a
                    program, run in the sandbox), "answer" (the final answer:
                    the episode ends) or "reply" (the reply is the observation)

The paper's three are registered here. A new model-backed tool is one more
entry (`META_TOOLS.register(name, MetaToolSpec(...))`), offered where a
`ToolConfig` lists it and has aliases for it. The wording is this project's own.
"""

from __future__ import annotations

import dataclasses

from orchestra_jax.registry import Registry

RESULT_KINDS = ("documents", "code", "answer", "reply")


@dataclasses.dataclass(frozen=True)
class MetaToolSpec:
    """One meta-tool (see the module docstring for the fields)."""

    name: str
    alias_prefix: str
    role: str
    role_prompt: str
    description: str
    argument_wording: str
    result: str = "reply"

    def __post_init__(self):
        if self.result not in RESULT_KINDS:
            raise ValueError(
                f"meta-tool {self.name!r}: result must be one of {RESULT_KINDS}, "
                f"got {self.result!r}"
            )
        if not self.name or not self.alias_prefix or not self.role:
            raise ValueError(f"meta-tool {self.name!r}: name, alias_prefix and role are required")


META_TOOLS: Registry[MetaToolSpec] = Registry("meta-tool")

# The paper's meta-tools, in the order a task offers them by default.
PAPER_META_TOOLS = ("search", "enhance_reasoning", "answer")

META_TOOLS.register(
    "search",
    MetaToolSpec(
        name="search",
        alias_prefix="search",
        role="query",
        role_prompt=(
            "You write search queries. Read the task and the context, decide "
            "what information is missing, and reply with a single concise "
            "search query on one line and nothing else."
        ),
        description=(
            "Search for missing information. The chosen model reads the "
            "conversation, writes a search query, and the retrieved "
            "documents are returned."
        ),
        argument_wording="search for missing information",
        result="documents",
    ),
)
META_TOOLS.register(
    "enhance_reasoning",
    MetaToolSpec(
        name="enhance_reasoning",
        alias_prefix="reasoner",
        role="code",
        role_prompt=(
            "You write Python code. Read the task and the context, and reply "
            "with one Python program in a ```python code block that prints "
            "the intermediate results needed to answer. Only the standard "
            "library, numpy and sympy are available; there is no network."
        ),
        description=(
            "Enhance reasoning: the chosen model analyses the "
            "problem, writes Python code, runs it and returns the "
            "code and its output as intermediate results."
        ),
        argument_wording="reason and write code",
        result="code",
    ),
)
META_TOOLS.register(
    "answer",
    MetaToolSpec(
        name="answer",
        alias_prefix="answer",
        role="answer",
        role_prompt=(
            "You answer questions. Read the task, the documents and the "
            "intermediate results, reason briefly, and end your reply with "
            "a last line of the form `Final answer: <answer>` giving only "
            "the answer."
        ),
        description=(
            "Give the final answer. The chosen model reads the question, the "
            "documents and intermediate results so far and answers; calling "
            "this ends the episode."
        ),
        argument_wording="answer",
        result="answer",
    ),
)


def is_meta_tool(name: str) -> bool:
    """True for a registered meta-tool name."""
    return name in META_TOOLS


def meta_tool(name: str) -> MetaToolSpec:
    """The table entry of meta-tool `name` (ValueError naming the known ones)."""
    return META_TOOLS.get(name)


def role_prompts() -> dict[str, str]:
    """Expert role -> its system prompt, over every registered meta-tool."""
    return {spec.role: spec.role_prompt for _, spec in META_TOOLS.items()}
