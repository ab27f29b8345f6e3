"""Offline stand-ins for expert models, answering through `ExpertClient`.

A `SimulatedExpert` reads the role from the system prompt (see `prompts`) and
the task from the `ToolContext`, and acts like a model of a given skill:

  query:  the task's ideal query (`metadata["search_query"]`) with
          probability `query_skill`, else a plausible wrong query
          (`metadata["distractor_queries"]`, else the question);
  code:   a program printing `result = <value of metadata["expression"]>` with
          probability `code_skill`, else one printing a wrong expression
          (`metadata["wrong_expressions"]`); tasks without an expression get
          a program that prints that there is nothing to compute;
  answer: the gold answer with probability
            p = max(skill[domain], reading_skill)  if the evidence
                (`metadata["evidence"]`) is in ctx.documents or ctx.notes
          (as whole words, see `contains_evidence`),
            p = skill[domain]                      otherwise;
          a wrong answer repeats the last number in the notes when the task
          is computed (a wrong program's output misleads the reader), else a
          distractor from `metadata["distractors"]`.

Randomness is a function of (seed, ctx.seed, task id, role, how many
documents/notes exist), so an episode replays identically. Token usage is
estimated as characters / 4 plus sampled hidden reasoning tokens; latency is
log-normal with mean `mean_latency_s`, and the call really sleeps
latency * `sleep_scale` seconds (0 by default).
"""

from __future__ import annotations

import asyncio
import math
import re
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from orchestra_jax.tools.experts import prompts
from orchestra_jax.tools.experts.client import ExpertError, ExpertReply

CHARS_PER_TOKEN = 4
NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")
DEFAULT_LATENCY_S = 10.0


def contains_evidence(text: str, evidence: str) -> bool:
    """True when `evidence` occurs in `text` not inside a longer word or number
    ("result = 12" is not evidence for "result = 1")."""
    return re.search(r"(?<!\w)" + re.escape(evidence) + r"(?!\w)", text) is not None


def lognormal_latency(rng: np.random.Generator, mean_s: float, sigma: float) -> float:
    """mean_s * exp(sigma * z - sigma**2 / 2), z ~ N(0, 1); its mean is mean_s."""
    return float(mean_s * math.exp(sigma * rng.standard_normal() - sigma**2 / 2))


def estimate_tokens(text: str) -> int:
    """ceil(len(text) / 4): the usual characters-per-token rule of thumb."""
    return -(-len(text) // CHARS_PER_TOKEN)


class SimulatedExpert:
    """A seeded model of given skill; see the module docstring.

    Args:
      name: for error messages and logs.
      skills: probability of a correct unaided answer per task domain.
      default_skill: for domains not in `skills`.
      query_skill / code_skill / reading_skill: see the module docstring.
      mean_latency_s: mean simulated latency, one number or a mapping
        role -> seconds ("query", "code", "answer"; missing roles: 10 s).
      latency_sigma: log-normal spread.
      reasoning_tokens: mean hidden tokens added to every completion.
      sleep_scale: real seconds slept per simulated second.
      seed: base seed.
    """

    def __init__(
        self,
        name: str,
        skills: Mapping[str, float],
        *,
        default_skill: float = 0.0,
        query_skill: float = 0.9,
        code_skill: float = 0.9,
        reading_skill: float = 0.95,
        mean_latency_s: float | Mapping[str, float] = 10.0,
        latency_sigma: float = 0.3,
        reasoning_tokens: int = 0,
        sleep_scale: float = 0.0,
        seed: int = 0,
    ):
        probs = dict(
            skills, default=default_skill, query=query_skill, code=code_skill, reading=reading_skill
        )
        bad = {k: v for k, v in probs.items() if not 0.0 <= v <= 1.0}
        if bad:
            raise ValueError(f"simulated expert {name!r}: skills must be in [0, 1], got {bad}")
        if isinstance(mean_latency_s, Mapping):
            self.latency_by_role = dict(mean_latency_s)
        else:
            self.latency_by_role = {r: float(mean_latency_s) for r in prompts.role_prompts()}
        if (
            min(self.latency_by_role.values(), default=0.0) < 0
            or latency_sigma < 0
            or sleep_scale < 0
        ):
            raise ValueError("latency parameters and sleep_scale must be >= 0")
        self.name = name
        self.skills = dict(skills)
        self.default_skill = default_skill
        self.query_skill = query_skill
        self.code_skill = code_skill
        self.reading_skill = reading_skill
        self.latency_sigma = latency_sigma
        self.reasoning_tokens = reasoning_tokens
        self.sleep_scale = sleep_scale
        self.seed = seed

    def skill(self, domain: str) -> float:
        return self.skills.get(domain, self.default_skill)

    async def complete(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        max_tokens: int = 1024,
        temperature: float = 0.0,
        ctx: Any = None,
    ) -> ExpertReply:
        del max_tokens, temperature  # the simulated output is short and seeded
        if ctx is None:
            raise ExpertError(
                f"simulated expert {self.name!r} needs the ToolContext (ctx=) to know the task"
            )
        role = prompts.role_of(messages) or "answer"
        rng = np.random.default_rng(self._seed_for(ctx, role))
        if role == "query":
            text = self._query(ctx.task, rng)
        elif role == "code":
            text = self._code(ctx.task, rng)
        else:
            text = self._answer(ctx, rng)
        prompt_text = "".join(str(m.get("content", "")) for m in messages)
        hidden = int(rng.integers(self.reasoning_tokens // 2, self.reasoning_tokens * 3 // 2 + 1))
        latency = lognormal_latency(
            rng, self.latency_by_role.get(role, DEFAULT_LATENCY_S), self.latency_sigma
        )
        if self.sleep_scale > 0:
            await asyncio.sleep(latency * self.sleep_scale)
        return ExpertReply(
            text=text,
            prompt_tokens=estimate_tokens(prompt_text),
            completion_tokens=estimate_tokens(text) + hidden,
            latency_s=latency,
        )

    def _seed_for(self, ctx: Any, role: str) -> int:
        key = (
            f"{self.seed}|{ctx.seed}|{ctx.task.id}|{role}|{self.name}|"
            f"{len(ctx.documents)}|{len(ctx.notes)}"
        )
        return zlib.crc32(key.encode())

    def _query(self, task, rng: np.random.Generator) -> str:
        ideal = task.metadata.get("search_query", task.question)
        if rng.random() < self.query_skill:
            return ideal
        wrong = task.metadata.get("distractor_queries") or [task.question]
        return wrong[int(rng.integers(len(wrong)))]

    def _code(self, task, rng: np.random.Generator) -> str:
        expression = task.metadata.get("expression")
        if expression is None:
            body = 'print("Nothing to compute for this question.")'
        else:
            if rng.random() >= self.code_skill:
                wrong = task.metadata.get("wrong_expressions") or [f"({expression}) + 1"]
                expression = wrong[int(rng.integers(len(wrong)))]
            body = f"result = {expression}\nprint('result =', result)"
        return f"```python\n{body}\n```"

    def _answer(self, ctx: Any, rng: np.random.Generator) -> str:
        task = ctx.task
        evidence = task.metadata.get("evidence")
        seen = list(ctx.documents) + list(ctx.notes)
        has_evidence = bool(evidence) and any(contains_evidence(s, evidence) for s in seen)
        p = self.skill(task.domain)
        if has_evidence:
            p = max(p, self.reading_skill)
        if rng.random() < p:
            answer = task.answer
        else:
            answer = self._wrong_answer(task, ctx.notes, rng)
        return f"Based on the information available.\nFinal answer: {answer}"

    @staticmethod
    def _wrong_answer(task, notes: Sequence[str], rng: np.random.Generator) -> str:
        if "expression" in task.metadata and notes:
            numbers = NUMBER_RE.findall(notes[-1])
            if numbers and numbers[-1] != task.answer:
                return numbers[-1]
        wrong = [d for d in task.metadata.get("distractors", []) if d != task.answer]
        return wrong[int(rng.integers(len(wrong)))] if wrong else "unknown"
