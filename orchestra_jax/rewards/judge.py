"""LLM-as-judge grading for free-form answers, cached, with its cost kept apart.

Protocol: the judge model sees the question, the reference answer and the
prediction (in the wording of a `JUDGE_PROMPTS` style: "reference", the
released evaluation's, or "project"), and must end its reply with
`<correct>True</correct>` or `<correct>False</correct>`. A reply without that
tag counts as "not correct" (and is reported as a parse failure). As in the
reference, an answer that matches the gold exactly is correct without asking;
"exactly" is the judge's `answer_match`, a name in `ANSWER_MATCHES`:
"normalized" (`outcome.exact_match`: lower case, punctuation and articles
dropped; `LLMJudge`'s) or "lowercase" (`outcome.lowercase_match`: the
release's `strip().lower()` equality; `MatchFirst` puts it in front of any
judge, as `eval.protocol="paper"` does). The judge's dollars and
seconds are grading overhead, not the orchestrator's spending, so they are
returned in the verdict and summed on the judge, never added to a
trajectory's cost. A judge whose endpoint fails after the client's retries
raises `JudgeError` naming it: an episode is never silently graded wrong (the
grader marks it an infrastructure failure, `orchestra_jax/infra_failure.py`, and it is
neither trained on nor scored).
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any, Protocol, runtime_checkable

from orchestra_jax.infra_failure import InfraError, endpoint_of, is_service_failure
from orchestra_jax.io.jsonl_log import JsonlLog
from orchestra_jax.io.paths import as_path
from orchestra_jax.registry import Registry
from orchestra_jax.rewards.outcome import (
    GradableTask,
    exact_match,
    is_correct,
    is_valid_answer,
    lowercase_match,
)
from orchestra_jax.tools.pricing import token_cost

log = logging.getLogger(__name__)

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

# A judge's `answer_match`: the exact-match check `grade` settles answers with before
# asking it, `(prediction, reference) -> bool`.
ANSWER_MATCHES: Registry[Callable[[str, str], bool]] = Registry("answer match")
ANSWER_MATCHES.register("normalized", exact_match)
ANSWER_MATCHES.register("lowercase", lowercase_match)
DEFAULT_ANSWER_MATCH = "normalized"


class JudgeError(InfraError):
    """The judge could not give a verdict (its endpoint failed after retries)."""

    def __init__(self, message: str, *, endpoint: str):
        super().__init__(message, kind="judge", endpoint=endpoint)


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
    """Grades a free-form prediction against a reference answer.

    A judge may name its `answer_match` (`ANSWER_MATCHES`), the exact-match check
    `grade` applies before asking it; without one, `DEFAULT_ANSWER_MATCH`.
    """

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
    seconds and on `flush()` (the GRPO loop flushes after every step). A run
    killed while writing leaves at most its last line torn: that line is logged
    as a warning and dropped. Any other line that is not a verdict is a
    `JudgeCacheError` naming the file and line: the file is then not what this
    class wrote, and a wrong cached verdict would silently change rewards, so
    the run stops for a person to look rather than guess.
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
        verdicts = {"check": _verdict_problem, "what": "judge verdict", "error": JudgeCacheError}
        self._log = JsonlLog(path, **verdicts) if path is not None else None
        self.path = None if self._log is None else os.fspath(self._log.path)
        rows = [] if self._log is None else list(self._log.records)
        for other in also_read:
            other = as_path(other)
            if os.fspath(other) != self.path and other.exists():
                rows.extend(JsonlLog.read(other, **verdicts))
        for row in rows:
            super().__setitem__(row["key"], row["correct"])

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


class JudgeCacheError(ValueError):
    """A judge cache file holds a line that is not a verdict."""


def _verdict_problem(row: dict) -> str | None:
    """What keeps a cache row from being a verdict, or None."""
    if not isinstance(row.get("key"), str) or not isinstance(row.get("correct"), bool):
        return "key must be a string and correct a boolean"
    return None


class LLMJudge:
    """A `Judge` backed by an expert client (`tools` room's `ExpertClient`); `grade`
    settles normalised exact matches before asking it (`answer_match`).

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
      answer_match: the exact-match check `grade` settles answers with before asking
        (an `ANSWER_MATCHES` name; `reward.judge.answer_match`).
    """

    answer_match = DEFAULT_ANSWER_MATCH

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
        answer_match: str = DEFAULT_ANSWER_MATCH,
    ):
        ANSWER_MATCHES.get(answer_match)  # an unknown name fails here, naming the choices
        self.answer_match = answer_match
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
        except Exception as e:
            if not is_service_failure(e):  # a bug in the client: the run stops with it
                raise
            raise JudgeError(  # an endpoint that failed for good: the episode's failure
                f"judge {self.name!r} gave no verdict: {e}", endpoint=endpoint_of(self.client)
            ) from e
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


class MatchFirst:
    """`judge` behind another exact-match check: `grade` settles the answers that
    `answer_match` (an `ANSWER_MATCHES` name) accepts and asks `judge` about the
    rest. Calls and statistics are `judge`'s own."""

    def __init__(self, judge: Judge, answer_match: str):
        ANSWER_MATCHES.get(answer_match)  # an unknown name fails here, naming the choices
        self.judge, self.answer_match = judge, answer_match

    async def __call__(self, question: str, prediction: str, reference: str) -> JudgeVerdict:
        return await self.judge(question, prediction, reference)

    def stats(self) -> dict[str, float]:
        stats = getattr(self.judge, "stats", None)
        return stats() if stats is not None else {}


def answer_match_of(judge: Judge | None) -> Callable[[str, str], bool]:
    """The exact-match check `grade` applies before asking `judge` (see `Judge`)."""
    return ANSWER_MATCHES.get(getattr(judge, "answer_match", DEFAULT_ANSWER_MATCH))


async def grade(
    prediction: str | None, task: GradableTask, *, judge: Judge | None = None
) -> JudgeVerdict:
    """Grades any answer type: rule-based types locally, "judge" tasks with `judge`.

    Invalid answers (empty, > 500 words) are wrong without asking the judge, and
    answers the judge's exact-match check accepts (`answer_match_of`) are right
    without asking it.
    """
    if task.answer_type != "judge":
        return JudgeVerdict(correct=is_correct(prediction, task))
    if prediction is None or not is_valid_answer(prediction):
        return JudgeVerdict(correct=False)
    if judge is None:
        raise ValueError(
            f"task {getattr(task, 'id', '?')!r} has answer_type 'judge' but no judge was configured"
        )
    if answer_match_of(judge)(prediction, str(task.answer)):
        return JudgeVerdict(correct=True)
    return await judge(task.question, prediction, str(task.answer))
