"""What the orchestrator reads at each turn: a context policy, picked by `agent.context`.

A `ContextPolicy` builds the prompt ids of turn k of an episode from the episode
spec and its turns 0 … k − 1:

    history   turn 0 reads the system prompt (tool configuration, preferences)
              and the question; every later turn continues that sequence, the
              observations of earlier turns appended (`fresh_prompts` False:
              the agent loop appends them, the policy builds only turn 0).
    rebuild   every turn reads a fresh two-message chat rebuilt from the task
              (`fresh_prompts` True); the orchestrator never sees its own
              earlier turns:

        system: `system`
        user:   "Problem: {question}\\n\\n{context}\\n\\n{instruction}"

    where context = "Documents:\\n" + left_cut(D + C, context_tokens) when any
    document was gathered and C is not over its budget, with
        D = "Doc 1: {d_1[:doc_chars]}\\n\\nDoc 2: …" over the documents gathered so
            far, in `merge_documents` order (each search's results in reverse
            rank order, interleaved in front of the older ones);
        C = left_cut("```python\\n{code}\\n```\\n\\n```output\\n{output}\\n```\\n\\n" per
            program run so far, code_tokens), "```\\n" put back in front when the
            cut removed the first fence;
    left_cut(s, n) keeps the last n tokens of s. `programs` "stdout" (the
    release's) shows a program only when its stdout is not blank, the stdout
    verbatim; "formatted" shows every program with its observation (stdout,
    stderr, exit status, "(no output)"). `cut` "reference" cuts as the release's
    `cut_seq` does: every text re-decoded from its last n ids one id at a time,
    special tokens skipped, so special-token text inside a document (`<|im_end|>`)
    is dropped, and (a bug of the release, reproduced only here) a multi-byte
    character split over two ids becomes U+FFFD; "project" keeps a text under
    its budget as it is and decodes a cut tail in one piece. The chat is rendered with the
    episode's tool schemas (Qwen3's template, ready to answer) and its ids are
    cut to `prompt_tokens` by dropping the middle (the first ⌊n/2⌋ and last
    ⌈n/2⌉ ids kept).

    In a conversation (an episode with another party) the prompt is instead the
    conversation's messages so far (system prompt, the party's opening, the
    policy's turns, tool results, the party's messages) with whole messages
    dropped from the middle (`cut_middle_messages`) to fit
    `conversation_tokens` minus the tokens of the tool schemas (as JSON), then
    rendered with the tool schemas and cut to `prompt_tokens` as above. With
    message i of length L_i tokens (rendered alone by the template), T = Σ L_i
    and budget b: all messages when T ≤ b, else the messages that end within
    the first ⌊b/2⌋ tokens and those from the one holding token T − ⌈b/2⌉ on.

Token-exact either way: the ids a policy returns are exactly what the engine is
given, and the loop records them in the trajectory (`Turn.prompt_start`).

`CONTEXT_POLICIES` maps `agent.context` to a factory `(agent config section) ->
ContextPolicy` (the section: `agent/config.AgentConfig`); "package.module:attr" names
one's own.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any, Protocol

from orchestra_jax.chat.template import render
from orchestra_jax.registry import Registry

__all__ = [
    "CONTEXT_POLICIES",
    "ContextPolicy",
    "HistoryContext",
    "RebuildBudgets",
    "RebuildContext",
    "context_policy",
    "conversation_prompt_messages",
    "cut_middle_messages",
    "episode_evidence",
    "left_cut",
    "merge_documents",
    "middle_truncate",
    "rebuild_messages",
]


class ContextPolicy(Protocol):
    """How turn k's prompt is built. `fresh_prompts` False: only turn 0 is asked
    for (later turns continue the sequence, observations appended by the loop);
    True: every turn is asked for, each its own prompt (and its own training sample)."""

    @property
    def name(self) -> str: ...

    @property
    def fresh_prompts(self) -> bool: ...

    def prompt(
        self,
        spec: Any,
        tokenizer: Any,
        turns: Sequence[Any],
        *,
        enable_thinking: bool,
        messages: Sequence[dict[str, Any]] | None = None,
    ) -> list[int]:
        """The prompt ids of turn len(turns), given the episode's earlier `turns`;
        in a conversation the loop also passes its chat `messages` so far."""
        ...


CONTEXT_POLICIES: Registry[Any] = Registry("context policy")


def initial_messages(spec: Any) -> list[dict[str, str]]:
    """System prompt (role + preference wording) and the task's question."""
    return [
        {"role": "system", "content": spec.tool_config.system_prompt()},
        {"role": "user", "content": spec.task.question},
    ]


def render_prompt(
    spec: Any,
    tokenizer: Any,
    *,
    enable_thinking: bool,
    messages: Sequence[dict[str, Any]] | None = None,
) -> list[int]:
    """The prompt ids: `messages` (default: the initial messages) with the episode's
    tool schemas, ready to answer."""
    return tokenizer.encode(
        render(
            initial_messages(spec) if messages is None else list(messages),
            tools=spec.tool_schemas(),
            add_generation_prompt=True,
            enable_thinking=enable_thinking,
        )
    )


@dataclasses.dataclass(frozen=True)
class HistoryContext:
    """One growing sequence: turn 0's prompt is the system prompt and the question."""

    name: str = "history"
    fresh_prompts: bool = False

    def prompt(
        self,
        spec: Any,
        tokenizer: Any,
        turns: Sequence[Any],
        *,
        enable_thinking: bool,
        messages: Sequence[dict[str, Any]] | None = None,
    ) -> list[int]:
        if turns:
            raise ValueError("the history context builds only the first turn's prompt")
        return render_prompt(spec, tokenizer, enable_thinking=enable_thinking, messages=messages)


PROGRAM_VIEWS = ("formatted", "stdout")
CUTS = ("project", "reference")


@dataclasses.dataclass(frozen=True)
class RebuildBudgets:
    """The rebuilt prompt's parts and budgets (module docstring)."""

    system: str = "You are good at using tools. "
    instruction: str = "Choose an approriate tool."  # sic: the words the reference trains on
    doc_chars: int = 4000  # each document's first characters
    code_tokens: int = 24000  # programs and outputs: their last tokens
    context_tokens: int = 24000  # documents + programs: their last tokens
    prompt_tokens: int = 24000  # the rendered prompt: middle-truncated to this
    # A conversation's messages: whole ones dropped from the middle to fit this
    # many tokens, less the tool schemas' (the reference's 23,000 − tools).
    conversation_tokens: int = 23000
    programs: str = "formatted"  # "formatted" | "stdout" (the release's)
    cut: str = "project"  # "project" | "reference" (the release's cut_seq)

    def __post_init__(self):
        if self.programs not in PROGRAM_VIEWS:
            raise ValueError(f"programs must be one of {PROGRAM_VIEWS}, got {self.programs!r}")
        if self.cut not in CUTS:
            raise ValueError(f"cut must be one of {CUTS}, got {self.cut!r}")
        for name in (
            "doc_chars",
            "code_tokens",
            "context_tokens",
            "prompt_tokens",
            "conversation_tokens",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def merge_documents(older: Sequence[str], newer: Sequence[str]) -> list[str]:
    """The documents after a search: `newer` (this search's, in the order they are
    added) interleaved in front of `older`. With m = len(older) // len(newer) ≥ 1:
    newer[0], older[0:m], newer[1], older[m:2m], …, then the rest of `older`, a
    document already placed not repeated; with fewer older than newer documents:
    older + newer, as they are."""
    if not newer:
        return list(older)
    if len(older) < len(newer):
        return list(older) + list(newer)
    m = len(older) // len(newer)
    merged: list[str] = []
    for i, doc in enumerate(newer):
        for d in (doc, *older[i * m : (i + 1) * m]):
            if d not in merged:
                merged.append(d)
    return merged + list(older[m * len(newer) :])


def episode_evidence(
    turns: Sequence[Any], programs: str = "formatted"
) -> tuple[list[str], list[tuple[str, str]]]:
    """(documents, [(code, output)]) the episode's tools gathered in `turns`.

    Documents: per turn, the documents of its searches (`metadata["documents"]`,
    each search's in reverse rank order), merged in front of the earlier ones
    (`merge_documents`). Programs, in call order: every result with
    `metadata["code"]` and a non-blank output, the output `metadata["output"]`
    (the observation) for `programs="formatted"`, `metadata["stdout"]` (what the
    program printed, as it printed it) for "stdout".
    """
    key = "stdout" if programs == "stdout" else "output"
    documents: list[str] = []
    code: list[tuple[str, str]] = []
    for turn in turns:
        found: list[str] = []
        for result in turn.tool_results:
            meta = result.metadata or {}
            if isinstance(meta.get("documents"), list):
                found = merge_documents(found, [str(d) for d in meta["documents"]][::-1])
            output = meta.get(key)
            if isinstance(meta.get("code"), str) and isinstance(output, str) and output.strip():
                code.append((meta["code"], output))
        documents = merge_documents(documents, found)
    return documents, code


def left_cut(tokenizer: Any, text: str, budget: int, cut: str = "project") -> tuple[str, int]:
    """(the text of `text`'s last `budget` tokens, its length in tokens); `cut`
    "reference" decodes as the release's `cut_seq` (module docstring)."""
    if not text:
        return "", 0
    if cut == "reference":
        ids = tokenizer.encode(text)
        pieces = [tokenizer.decode([i], skip_special_tokens=True) for i in ids[-budget:]]
        return "".join(pieces), len(ids)
    ids = tokenizer.encode(text)
    if len(ids) <= budget:
        return text, len(ids)
    return tokenizer.decode(ids[-budget:], skip_special_tokens=True), len(ids)


def middle_truncate(ids: Sequence[int], budget: int) -> list[int]:
    """`ids` whole, or their first ⌊budget/2⌋ and last ⌈budget/2⌉ when longer."""
    if len(ids) <= budget:
        return list(ids)
    head = budget // 2
    return list(ids[:head]) + list(ids[len(ids) - (budget - head) :])


def cut_middle_messages(lengths: Sequence[int], budget: int) -> list[int]:
    """The indices of the messages kept when messages of `lengths` tokens must fit
    `budget` (at least 1; module docstring): all when they fit, else those ending
    within the first ⌊budget/2⌋ tokens and those from the one holding token
    T − ⌈budget/2⌉ (0-based, T the total) to the end."""
    budget = max(budget, 1)
    total = sum(lengths)
    if total <= budget:
        return list(range(len(lengths)))
    head, tail_start = budget // 2, total - (budget - budget // 2)
    kept, end = [], 0
    for i, n in enumerate(lengths):
        end += n
        if end <= head or end > tail_start:
            kept.append(i)
    return kept


def conversation_prompt_messages(
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]],
    tokenizer: Any,
    budgets: RebuildBudgets = RebuildBudgets(),
) -> list[dict[str, Any]]:
    """A conversation's messages, the middle dropped to fit `conversation_tokens`
    less the tool schemas' tokens (module docstring)."""
    tools_len = len(tokenizer.encode(json.dumps(list(tools), ensure_ascii=False))) if tools else 0
    lengths = [len(tokenizer.encode(render([m]))) for m in messages]
    kept = cut_middle_messages(lengths, budgets.conversation_tokens - tools_len)
    return [dict(messages[i]) for i in kept]


def rebuild_messages(
    question: str,
    documents: Sequence[str],
    code: Sequence[tuple[str, str]],
    tokenizer: Any,
    budgets: RebuildBudgets = RebuildBudgets(),
) -> list[dict[str, str]]:
    """The rebuilt chat of one turn (module docstring), before the template."""
    docs = "".join(f"Doc {i}: {d[: budgets.doc_chars]}\n\n" for i, d in enumerate(documents, 1))
    programs = "".join(f"```python\n{c}\n```\n\n```output\n{o}\n```\n\n" for c, o in code)
    programs_cut, programs_len = left_cut(tokenizer, programs, budgets.code_tokens, budgets.cut)
    if programs_cut and not programs_cut.startswith("```"):
        programs_cut = "```\n" + programs_cut
    if programs_len < budgets.code_tokens:
        context, _ = left_cut(tokenizer, docs + programs_cut, budgets.context_tokens, budgets.cut)
        if docs:
            context = "Documents:\n" + context
    else:
        context = programs_cut
    return [
        {"role": "system", "content": budgets.system},
        {
            "role": "user",
            "content": f"Problem: {question}\n\n{context}\n\n{budgets.instruction}",
        },
    ]


@dataclasses.dataclass(frozen=True)
class RebuildContext:
    """Every turn a fresh chat rebuilt from the task and the evidence gathered so far."""

    budgets: RebuildBudgets = RebuildBudgets()
    name: str = "rebuild"
    fresh_prompts: bool = True

    def prompt(
        self,
        spec: Any,
        tokenizer: Any,
        turns: Sequence[Any],
        *,
        enable_thinking: bool,
        messages: Sequence[dict[str, Any]] | None = None,
    ) -> list[int]:
        tools = spec.tool_schemas()
        if spec.other_party is not None:
            if messages is None:
                raise ValueError("a conversation's rebuilt prompt needs its messages")
            chat = conversation_prompt_messages(messages, tools, tokenizer, self.budgets)
        else:
            documents, code = episode_evidence(turns, self.budgets.programs)
            chat = rebuild_messages(spec.task.question, documents, code, tokenizer, self.budgets)
        ids = render_prompt(spec, tokenizer, enable_thinking=enable_thinking, messages=chat)
        return middle_truncate(ids, self.budgets.prompt_tokens)


@CONTEXT_POLICIES.register("history")
def history_context(agent: Any = None) -> HistoryContext:
    """The growing sequence (the project's default)."""
    return HistoryContext()


@CONTEXT_POLICIES.register("rebuild")
def rebuild_context(agent: Any = None) -> RebuildContext:
    """The reference's rebuilt prompt, budgets from `agent.rebuild` when given."""
    fields = {f.name for f in dataclasses.fields(RebuildBudgets)}
    section: Any = getattr(agent, "rebuild", None) or {}
    if hasattr(section, "keys"):  # a mapping (a ConfigDict)
        values = {k: v for k, v in dict(section).items() if k in fields}
    else:  # the typed section, `agent/config.RebuildConfig`
        values = {k: getattr(section, k) for k in fields if hasattr(section, k)}
    return RebuildContext(RebuildBudgets(**values))


def context_policy(agent: Any) -> ContextPolicy:
    """The policy `agent.context` names, built from the `agent` section."""
    return CONTEXT_POLICIES.get(agent.context)(agent)
