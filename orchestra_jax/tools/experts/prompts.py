"""Role prompts for expert models, and parsing of what they write back.

The meta-tools call an expert in their role (`meta_tool_table.py`); the
paper's three:
  "query":  write one search query for the missing information;
  "code":   write one Python program whose printed output helps answer;
  "answer": answer the question, ending with `Final answer: <answer>`.
Each role has a fixed system prompt; `role_of(messages)` recovers the role
from it (simulated experts use this, as a real model reads the prompt).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from orchestra_jax.tools.meta_tool_table import role_prompts

FINAL_ANSWER_RE = re.compile(r"final answer\s*:\s*(.+)", re.IGNORECASE)
BOXED_RE = re.compile(r"\\boxed\{([^{}]*)\}")
CODE_BLOCK_RE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def role_messages(
    role: str,
    question: str,
    documents: Sequence[str] = (),
    notes: Sequence[str] = (),
    context: str = "",
) -> list[dict[str, Any]]:
    """Chat messages asking an expert to act in `role` on `question`.

    The user message holds the question, then the documents and intermediate
    results gathered so far (numbered), then optional extra context.
    """
    prompts = role_prompts()
    if role not in prompts:
        raise ValueError(f"unknown expert role {role!r}; known: {sorted(prompts)}")
    parts = [f"Task: {question}"]
    if documents:
        parts.append("Documents:\n" + "\n".join(f"[{i + 1}] {d}" for i, d in enumerate(documents)))
    if notes:
        parts.append(
            "Intermediate results:\n" + "\n".join(f"({i + 1}) {n}" for i, n in enumerate(notes))
        )
    if context:
        parts.append(f"Context:\n{context}")
    return [
        {"role": "system", "content": prompts[role]},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def role_of(messages: Sequence[dict[str, Any]]) -> str | None:
    """The role whose system prompt opens `messages`, or None."""
    if messages and messages[0].get("role") == "system":
        for role, prompt in role_prompts().items():
            if messages[0].get("content") == prompt:
                return role
    return None


def extract_final_answer(text: str) -> str:
    """The answer in `text`: the last `Final answer:` line, else the last
    `\\boxed{}`, else the last non-empty line."""
    finals = FINAL_ANSWER_RE.findall(text)
    if finals:
        return finals[-1].strip().strip("`").strip()
    boxed = BOXED_RE.findall(text)
    if boxed:
        return boxed[-1].strip()
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def extract_code(text: str) -> str:
    """The last ```python block of `text`, else the whole text."""
    blocks = CODE_BLOCK_RE.findall(text)
    return blocks[-1] if blocks else text


def extract_query(text: str) -> str:
    """The first non-empty line, without quotes or a `Query:` prefix."""
    for line in text.strip().splitlines():
        line = line.strip().strip('"').strip()
        if line:
            return re.sub(r"^(search )?query\s*:\s*", "", line, flags=re.IGNORECASE)
    return ""
