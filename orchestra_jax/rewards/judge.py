"""LLM-as-judge grading for free-form answers, cached, with its cost kept apart.

Protocol: the judge model sees the question, the reference answer and the
prediction (in the wording of a `JUDGE_PROMPTS` style: "reference", the
released evaluation's, or "project"), and must end its reply with
`<correct>True</correct>` or `<correct>False</correct>`. A reply without that
tag counts as "not correct" (and is reported as a parse failure). As in the
reference, an answer that matches the gold exactly after normalisation
(`outcome.exact_match`) is correct without asking. The judge's dollars and
seconds are grading overhead, not the orchestrator's spending, so they are
returned in the verdict and summed on the judge, never added to a
trajectory's cost. A judge whose endpoint fails after the client's retries
raises `JudgeError` naming it: an episode is never silently graded wrong.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import re
from collections.abc import Iterable, MutableMapping
from typing import Any, Protocol, runtime_checkable

from orchestra_jax.io.jsonl_log import JsonlLog
from orchestra_jax.io.paths import as_path
from orchestra_jax.registry import Registry
from orchestra_jax.rewards.outcome import GradableTask, exact_match, is_correct, is_valid_answer
from orchestra_jax.tools.pricing import token_cost

_VERDICT = re.compile(r"<correct>\s*(true|false)\s*</correct>", re.IGNORECASE)

JUDGE_PROMPT = """You are grading an answer to a question.

Question:
{question}

Reference answer:
{reference}

Answer to grade:
{prediction}

Is the answer to grade correct, i.e. does it state the same final answer as the
reference (ignore wording, formatting and extra explanation)? Think briefly,
then finish with exactly <correct>True</correct> or <correct>False</correct>."""

# The released evaluation's layout: question, student answer, reference answer,
# then the instruction (this project's wording).
REFERENCE_JUDGE_PROMPT = """Question: {question}

Student answer: {prediction}

Reference answer: {reference}

Assume that the reference answer is correct. Output <correct>True</correct> if the \
student answer matches the reference answer. Output <correct>False</correct> if the \
student answer does not match the reference answer."""

# `reward.judge.prompt`: a template with {question}, {reference} and {prediction}.
JUDGE_PROMPTS: Registry[str] = Registry("judge prompt")
JUDGE_PROMPTS.register("project", JUDGE_PROMPT)
JUDGE_PROMPTS.register("reference", REFERENCE_JUDGE_PROMPT)


class JudgeError(RuntimeError):
    """The judge could not give a verdict (its endpoint failed after retries)."""


@dataclasses.dataclass(frozen=True)
class JudgeVerdict:
    """A judge's decision and what it cost (zero when served from the cache).

    `info`: what a grader reports beyond the decision (e.g. τ²-bench's reward
    and its breakdown), kept in the trajectory's `metadata["grade"]`.
    """

    correct: bool
    cost_usd: float = 0.0
    latency_s: float = 0.0
    cached: bool = False
    parse_failed: bool = False
    info: dict[str, Any] | None = None


@runtime_checkable
class Judge(Protocol):
    """Grades a free-form prediction against a reference answer."""

    async def __call__(self, question: str, prediction: str, reference: str) -> JudgeVerdict: ...


def parse_verdict(text: str) -> bool | None:
    """The last `<correct>True|False</correct>` tag in `text`, or None when absent."""
    tags = _VERDICT.findall(text)
    return tags[-1].lower() == "true" if tags else None


class JudgeCache(dict):
    """Verdicts keyed by a hash of (judge settings, question, reference, prediction).

    With a `path` (local or `gs://`, `io/paths.py`), verdicts are kept in a
    JSON-lines file (`io.jsonl_log.JsonlLog`) and read back on construction,
    with those of the files in `also_read` (other hosts' caches), so a resumed
    run does not pay twice. Locally each verdict is appended at once; on an
    object store the file is uploaded whole at most every `flush_interval_s`
    seconds and on `flush()` (the GRPO loop flushes after every step).
    """

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        *,
        also_read: Iterable[str | os.PathLike] = (),
        flush_interval_s: float = 30.0,
    ):
        super().__init__()
        self.flush_interval_s = flush_interval_s
        self._log = JsonlLog(path) if path is not None else None
        self.path = None if self._log is None else os.fspath(self._log.path)
        rows = [] if self._log is None else list(self._log.records)
        for other in also_read:
            other = as_path(other)
            if os.fspath(other) != self.path and other.exists():
                rows.extend(JsonlLog.read(other))
        for row in rows:
            super().__setitem__(row["key"], bool(row["correct"]))

    def __setitem__(self, key: str, correct: bool) -> None:
        super().__setitem__(key, bool(correct))
        if self._log is not None:
            self._log.append({"key": key, "correct": bool(correct)})
            if self._log.seconds_since_flush() >= self.flush_interval_s:
                self._log.flush()

    def flush(self) -> None:
        """Writes verdicts not yet in the file (object stores; locally they are)."""
        if self._log is not None:
            self._log.flush()


class LLMJudge:
    """A `Judge` backed by an expert client (`tools` room's `ExpertClient`).

    Args:
      expert_client: has `complete(messages, *, max_tokens, temperature)`
        returning (or resolving to) an object with `text`, `prompt_tokens`,
        `completion_tokens` and `latency_s`.
      cache: a mutable mapping from verdict key to bool (`JudgeCache`, a dict,
        or None for no caching).
      price_in, price_out: the judge model's USD price per million input/output
        tokens, for the separately reported grading cost.
      name: names the judge in errors and in the cache key (model and prompt style).
      prompt: the template (`JUDGE_PROMPTS`), with {question}, {reference}, {prediction}.
    """

    def __init__(
        self,
        expert_client: Any,
        cache: MutableMapping[str, bool] | None = None,
        *,
        price_in: float = 0.0,
        price_out: float = 0.0,
        max_tokens: int = 512,
        temperature: float = 0.0,
        name: str = "judge",
        prompt: str = JUDGE_PROMPT,
    ):
        self.client = expert_client
        self.cache = cache
        self.price_in, self.price_out = price_in, price_out
        self.max_tokens, self.temperature, self.name = max_tokens, temperature, name
        self.prompt = prompt
        self.total_cost_usd = 0.0
        self.num_calls = 0
        self.num_cache_hits = 0
        self.num_parse_failures = 0

    def cache_key(self, question: str, prediction: str, reference: str) -> str:
        blob = json.dumps(
            [self.name, self.temperature, self.prompt, question, reference, prediction]
        )
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    async def __call__(self, question: str, prediction: str, reference: str) -> JudgeVerdict:
        key = self.cache_key(question, prediction, reference)
        if self.cache is not None and key in self.cache:
            self.num_cache_hits += 1
            return JudgeVerdict(correct=self.cache[key], cached=True)
        prompt = self.prompt.format(question=question, reference=reference, prediction=prediction)
        try:
            reply = self.client.complete(
                [{"role": "user", "content": prompt}],
                max_tokens=self.max_tokens,
                temperature=self.temperature,
            )
            if inspect.isawaitable(reply):
                reply = await reply
        except Exception as e:  # an endpoint that failed for good: the step fails, loudly
            raise JudgeError(f"judge {self.name!r} gave no verdict: {e}") from e
        cost = token_cost(
            reply.prompt_tokens, reply.completion_tokens, self.price_in, self.price_out
        )
        self.num_calls += 1
        self.total_cost_usd += cost
        parsed = parse_verdict(reply.text)
        if parsed is None:
            self.num_parse_failures += 1
        elif self.cache is not None:  # a reply without a verdict is not worth remembering
            self.cache[key] = parsed
        return JudgeVerdict(
            correct=bool(parsed),
            cost_usd=cost,
            latency_s=reply.latency_s,
            parse_failed=parsed is None,
        )

    def flush(self) -> None:
        """Writes the cache's new verdicts to its file (see `JudgeCache`)."""
        flush = getattr(self.cache, "flush", None)
        if flush is not None:
            flush()

    def stats(self) -> dict[str, float]:
        """Grading overhead for metrics: calls, cache hits, parse failures, dollars."""
        return {
            "judge/calls": self.num_calls,
            "judge/cache_hits": self.num_cache_hits,
            "judge/parse_failures": self.num_parse_failures,
            "judge/cost_usd": self.total_cost_usd,
        }


async def grade(
    prediction: str | None, task: GradableTask, *, judge: Judge | None = None
) -> JudgeVerdict:
    """Grades any answer type: rule-based types locally, "judge" tasks with `judge`.

    Invalid answers (empty, > 500 words) are wrong without asking the judge, and
    answers equal to the gold after normalisation are right without asking it.
    """
    if task.answer_type != "judge":
        return JudgeVerdict(correct=is_correct(prediction, task))
    if prediction is None or not is_valid_answer(prediction):
        return JudgeVerdict(correct=False)
    if judge is None:
        raise ValueError(
            f"task {getattr(task, 'id', '?')!r} has answer_type 'judge' but no judge was configured"
        )
    if exact_match(prediction, str(task.answer)):
        return JudgeVerdict(correct=True)
    return await judge(task.question, prediction, str(task.answer))
