"""How a meta-tool asks its expert and reads the reply: `tools.experts`.

A protocol decides, for an expert of a model family (the catalogue's `family`:
"qwen", "math", "gpt", "other"; "" where unstated), what the expert reads and
at which temperature it samples (`request`), how its reply becomes a search
query (`query`), a program (`code`), or a final answer (`answer`), how long the
program may run (`code_timeout_s`), what of the run the later experts read
(`note`), and whether an empty answer ends the episode (`empty_answer_ends`).
The meta-tools (`meta_tools.py`) call these and do everything else (alias
resolution, pricing, the sandbox, the retriever) the same way under every
protocol.

`EXPERT_PROTOCOLS` names them:

  "project"    (default) the role's system prompt; one user message with the
               task, the documents and intermediate results so far, and the
               orchestrator's own words (its last `CONTEXT_CHARS` characters);
               `tools.expert_temperature`; a query is the reply's first line,
               a program its last ```python block, an answer its
               `Final answer:` line (else `\\boxed{}`, else last line); the
               program's stdout, stderr and exit are noted; an empty answer is
               an error the orchestrator sees, and the episode goes on.
  "reference"  experts as sub-agents (ToolOrchestra's released training code):
               one user message holding only the documents and code outputs
               within the family's budget (`REFERENCE_BUDGETS`), then the
               question and the role's instruction; temperature 1.0 for "gpt",
               0.2 otherwise; the query is the text inside `<query>` (the
               question when under 5 characters), cut to 390 characters; the
               program is the text after the last ```python, run for 60 s;
               its stdout, when not blank, is noted with the program; the
               answer is inside the last `\\boxed{}` ("qwen", "math") or
               `<answer>` ("gpt", "other"); any answer, empty too, ends the
               episode. Roles other than the paper's three are asked as
               "project" asks them.

A protocol of one's own is an object with the same methods, named by
"package.module:attr" in `tools.experts`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from orchestra_jax.registry import Registry
from orchestra_jax.tools.experts import prompts
from orchestra_jax.tools.function_tools import format_sandbox_result

# What the catalogue's `family` field may say (`catalogue.parse_model`).
MODEL_FAMILIES = ("qwen", "math", "gpt", "other")
CONTEXT_CHARS = 2000  # the orchestrator's words a "project" expert reads


@runtime_checkable
class ExpertProtocol(Protocol):
    """What `tools.experts` names (see the module docstring)."""

    name: str
    needs_family: bool  # every live model must state its catalogue `family`
    empty_answer_ends: bool

    def request(
        self, role: str, family: str, ctx: Any, temperature: float
    ) -> tuple[list[dict[str, Any]], float]:
        """(messages, temperature) for an expert of `family` acting in `role`;
        `temperature` is `tools.expert_temperature`."""
        ...

    def query(self, text: str, question: str) -> str: ...

    def charged_query(self, text: str, question: str) -> str:
        """The query a search is charged for (`search_pricing`): the one sent, unless
        the protocol cuts what it sends."""
        ...

    def code(self, text: str) -> str: ...

    def code_timeout_s(self, configured_s: float) -> float: ...

    def note(self, code: str, result: Any) -> str | None: ...

    def answer(self, text: str, family: str) -> str: ...


def conversation_context(messages: Sequence[dict[str, Any]]) -> str:
    """The orchestrator's own words so far (its assistant turns), last
    CONTEXT_CHARS characters: what it has reasoned about the task."""
    said = [str(m.get("content") or "") for m in messages if m.get("role") == "assistant"]
    return "\n".join(s for s in said if s.strip())[-CONTEXT_CHARS:]


class ProjectProtocol:
    """The project's experts: role prompts, the orchestrator's words, one temperature."""

    name = "project"
    needs_family = False
    empty_answer_ends = False

    def request(self, role, family, ctx, temperature):
        del family
        messages = prompts.role_messages(
            role,
            ctx.task.question,
            ctx.documents,
            ctx.notes,
            conversation_context(ctx.messages),
        )
        return messages, temperature

    def query(self, text, question):
        del question
        return prompts.extract_query(text)

    def charged_query(self, text, question):
        return self.query(text, question)

    def code(self, text):
        return prompts.extract_code(text)

    def code_timeout_s(self, configured_s):
        return configured_s

    def note(self, code, result):
        del code
        return format_sandbox_result(result)

    def answer(self, text, family):
        del family
        return prompts.extract_final_answer(text)


# --- the reference's sub-agents ----------------------------------------------------

# The roles' instructions, after the question (the reference's structure, own words).
REFERENCE_QUERY_INSTRUCTION = (
    "Do not answer the question. Write one search query for a relevant piece of "
    "information that is still missing: a few keywords or a short sentence. Put the "
    "query between <query> and </query>."
)
REFERENCE_CODE_INSTRUCTION = (
    "Do not answer the question. Write Python code whose execution prints intermediate "
    "results that help answer it. Put the code between ```python and ```. The code "
    "must run on its own, with every import and definition it needs."
)
REFERENCE_BOXED_INSTRUCTION = "Reason step by step, then give the final answer inside \\boxed{}."
REFERENCE_ANSWER_TAG_INSTRUCTION = (
    "Put your reasoning between <think> and </think>, then only the exact answer, "
    "with no explanation, between <answer> and </answer>."
)
BOXED_FAMILIES = ("qwen", "math")
MIN_QUERY_CHARS = 5
MAX_QUERY_CHARS = 390
REFERENCE_CODE_TIMEOUT_S = 60.0
CHARS_PER_TOKEN = 4  # the reference cuts in tokens of its tokenizer; here in characters


@dataclasses.dataclass(frozen=True)
class Budget:
    """What of the episode's documents and code outputs an expert reads.

    doc_chars: each document's first characters (None: whole); code_tokens:
    the code outputs' last tokens; context_tokens: the last tokens of
    documents and code outputs together. Tokens are cut as CHARS_PER_TOKEN
    characters each.
    """

    doc_chars: int | None
    code_tokens: int
    context_tokens: int


# (role, family) -> Budget, as the reference's `execute_predictions` gives them.
REFERENCE_BUDGETS: dict[tuple[str, str], Budget] = {
    ("query", "gpt"): Budget(None, 40000, 100000),
    ("query", "qwen"): Budget(4000, 16000, 24000),
    ("query", "math"): Budget(4000, 16000, 24000),
    ("query", "other"): Budget(None, 40000, 80000),
    ("code", "gpt"): Budget(None, 40000, 100000),
    ("code", "qwen"): Budget(200, 16000, 24000),
    ("code", "math"): Budget(200, 16000, 24000),
    ("code", "other"): Budget(200, 8000, 12000),
    ("answer", "gpt"): Budget(None, 40000, 100000),
    ("answer", "qwen"): Budget(4000, 16000, 24000),
    ("answer", "math"): Budget(500, 1000, 2000),
    ("answer", "other"): Budget(None, 40000, 80000),
}


def keep_last_tokens(text: str, tokens: int) -> str:
    """The last `tokens` tokens of `text`, as `tokens * CHARS_PER_TOKEN` characters."""
    return text[-tokens * CHARS_PER_TOKEN :] if text else ""


def reference_context(documents: Sequence[str], notes: Sequence[str], budget: Budget) -> str:
    """Documents ("Doc i: ...", each cut to `budget.doc_chars`) then code outputs,
    kept to the budget's last tokens, under "Documents:" when there are documents."""
    docs = "".join(
        f"Doc {i + 1}: {d if budget.doc_chars is None else d[: budget.doc_chars]}\n\n"
        for i, d in enumerate(documents)
    )
    code = keep_last_tokens("".join(notes), budget.code_tokens)
    if code and not code.startswith("```"):
        code = "```\n" + code
    context = keep_last_tokens(docs + code, budget.context_tokens)
    return "Documents:\n" + context if docs else context


def reference_prompt(role: str, family: str, question: str, context: str) -> str:
    """The sub-agent's one user message: context, then the question and the role's
    instruction (the answer's by family)."""
    head = context.strip() + "\n\n"
    if role == "query":
        return head + f"Question: {question}\n{REFERENCE_QUERY_INSTRUCTION}"
    if role == "code":
        return head + f"Question: {question}\n{REFERENCE_CODE_INSTRUCTION}"
    if family in BOXED_FAMILIES:
        return head + f"{question}\n{REFERENCE_BOXED_INSTRUCTION}"
    return head + f"{question}\n{REFERENCE_ANSWER_TAG_INSTRUCTION}"


def extract_tagged_query(text: str, question: str) -> str:
    """The text after the last `<query>` up to `</query>`; the question when that is
    under MIN_QUERY_CHARS characters; cut to MAX_QUERY_CHARS characters."""
    return extract_tagged_query_whole(text, question)[:MAX_QUERY_CHARS]


def extract_tagged_query_whole(text: str, question: str) -> str:
    """`extract_tagged_query` before the cut: what the release charges a local index's
    search for (the tokens of `query_to_call`, generation_quick3.py 565, before it
    sends `query_to_call[:390]`)."""
    query = text.split("<query>")[-1].split("</query>")[0]
    return question if len(query) < MIN_QUERY_CHARS else query


def extract_python_after_fence(text: str) -> str:
    """The text after the last ```python up to the next ``` (all of it without either)."""
    return text.split("```python")[-1].split("```")[0]


def extract_boxed(text: str) -> str:
    """What follows the last `\\boxed{` up to the text's last `}`; "" without `\\boxed{`."""
    if "\\boxed{" not in text:
        return ""
    return "}".join(text.split("\\boxed{")[-1].split("}")[:-1]).strip()


def extract_answer_tag(text: str) -> str:
    """The text after the last `<answer>` up to `</answer>` (all of it without tags)."""
    return text.split("<answer>")[-1].split("</answer>")[0].strip()


def reference_temperature(family: str) -> float:
    return 1.0 if family == "gpt" else 0.2


class ReferenceProtocol:
    """The reference's sub-agents (see the module docstring)."""

    name = "reference"
    needs_family = True
    empty_answer_ends = True
    roles = ("query", "code", "answer")

    def __init__(self):
        self._project = ProjectProtocol()

    def request(self, role, family, ctx, temperature):
        if role not in self.roles:
            return self._project.request(role, family, ctx, temperature)
        budget = REFERENCE_BUDGETS[(role, family or "other")]
        context = reference_context(ctx.documents, ctx.notes, budget)
        content = reference_prompt(role, family, ctx.task.question, context)
        return [{"role": "user", "content": content}], reference_temperature(family)

    def query(self, text, question):
        return extract_tagged_query(text, question)

    def charged_query(self, text, question):
        return extract_tagged_query_whole(text, question)

    def code(self, text):
        return extract_python_after_fence(text)

    def code_timeout_s(self, configured_s):
        del configured_s
        return REFERENCE_CODE_TIMEOUT_S

    def note(self, code, result):
        stdout = "" if result.timed_out else result.stdout
        if not stdout.strip():
            return None
        return f"```python\n{code}\n```\n\n```output\n{stdout}\n```\n\n"

    def answer(self, text, family):
        return extract_boxed(text) if family in BOXED_FAMILIES else extract_answer_tag(text)


EXPERT_PROTOCOLS: Registry[ExpertProtocol] = Registry("expert protocol")
EXPERT_PROTOCOLS.register("project", ProjectProtocol())
EXPERT_PROTOCOLS.register("reference", ReferenceProtocol())
PROJECT = EXPERT_PROTOCOLS.get("project")
