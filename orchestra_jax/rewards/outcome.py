"""Is a final answer right? Rule-based checks dispatched on `task.answer_type`.

Answer types (`tasks.Task.answer_type`):
  "exact"   normalised string equality (lower case, no punctuation/articles,
            collapsed white space), also accepting a bare `\\boxed{...}` answer;
  "numeric" the first number in the prediction equals the reference number,
            exactly for an integer reference, else within a relative/absolute
            tolerance (commas, `$`, `%` ignored);
  "math"    symbolic equivalence through `math-verify` (falls back to "numeric"
            and then "exact" when math-verify parses nothing);
  "judge"   free-form answers graded by an LLM judge (`rewards/judge.py`);
  "environment"  the task's environment grades the whole episode (τ²-bench):
            no answer check applies, so asking here is an error.
An empty answer, or one longer than `MAX_ANSWER_WORDS` words, is always wrong.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from orchestra_jax.tasks import ANSWER_TYPES

MAX_ANSWER_WORDS = 500

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_INTEGER = re.compile(r"[-+]?\d+")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_BOXED_OPEN = "\\boxed{"


class GradableTask(Protocol):
    """The fields of `tasks.Task` that grading reads."""

    @property
    def question(self) -> str: ...

    @property
    def answer(self) -> Any: ...

    @property
    def answer_type(self) -> str: ...


def is_valid_answer(prediction: str | None) -> bool:
    """True when the answer is non-empty and at most `MAX_ANSWER_WORDS` words."""
    if prediction is None:
        return False
    words = prediction.split()
    return 0 < len(words) <= MAX_ANSWER_WORDS


def normalize_answer(text: str) -> str:
    """Lower case, strip a `\\boxed{}` wrapper, punctuation and articles, collapse spaces."""
    text = unboxed(text).lower()
    text = "".join(ch for ch in text if ch not in string.punctuation)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def unboxed(text: str) -> str:
    """What lies between the first `\\boxed{` and the last `}` after it; else `text`."""
    start, end = text.find(_BOXED_OPEN), text.rfind("}")
    if start != -1 and end >= start + len(_BOXED_OPEN):
        return text[start + len(_BOXED_OPEN) : end]
    return text


def exact_match(prediction: str, reference: str) -> bool:
    """normalize(prediction) == normalize(reference)."""
    return normalize_answer(prediction) == normalize_answer(str(reference))


def lowercase_match(prediction: str, reference: str) -> bool:
    """The reference release's check before its judge (`evaluation/eval_hle.py`,
    `eval_frames.py`): equal after stripping outer white space and lower-casing."""
    return prediction.strip().lower() == str(reference).strip().lower()


def _without_separators(text: str) -> str:
    """`text` without thousands separators and dollar signs."""
    return text.replace(",", "").replace("$", "")


def _first_number_text(text: str) -> str | None:
    """The first number literal in `text` (separators and `$` ignored), or None."""
    match = _NUMBER.search(_without_separators(text))
    return match.group(0) if match else None


def parse_number(text: str) -> float | None:
    """The first number in `text` (thousands separators, `$` and `%` ignored), or None."""
    number = _first_number_text(text)
    return float(number) if number is not None else None


def numeric_match(
    prediction: str, reference: str | float, *, rel_tol: float = 1e-4, abs_tol: float = 1e-8
) -> bool:
    """The first numbers found agree: exactly when the reference is an integer (a
    count, or an exact computation: 27,512,346 is not 27,512,345, although the two
    are within any useful relative tolerance), else within
    max(rel_tol · max(|p|, |r|), abs_tol)."""
    pred = _first_number_text(prediction)
    if pred is None:
        return False
    if isinstance(reference, str) and _INTEGER.fullmatch(
        plain := _without_separators(reference.strip())
    ):
        reference = int(plain)
    if isinstance(reference, int):
        return _exact_number(pred) == reference
    ref = reference if isinstance(reference, float) else parse_number(str(reference))
    if ref is None:
        return False
    return math.isclose(float(pred), ref, rel_tol=rel_tol, abs_tol=abs_tol)


def _exact_number(text: str) -> int | float:
    """An integer literal as an exact int (no float rounding above 2**53), else a float."""
    return int(text) if _INTEGER.fullmatch(text) else float(text)


def math_match(prediction: str, reference: str) -> bool | None:
    """Symbolic equivalence via math-verify; None when either side does not parse."""
    from math_verify import parse, verify  # heavy import (sympy), only when needed

    try:
        gold = parse(_as_math(str(reference)))
        pred = parse(_as_math(prediction))
        if not gold or not pred:
            return None
        return bool(verify(gold, pred))
    except Exception:  # math-verify raises on pathological LaTeX; that is a "no"
        return None


def _as_math(text: str) -> str:
    """math-verify finds answers inside `$…$` or `\\boxed{}`; wrap bare expressions."""
    if "$" in text or "\\boxed" in text or "\\(" in text or "\\[" in text:
        return text
    return f"${text}$"


def is_correct(prediction: str | None, task: GradableTask) -> bool:
    """Grades `prediction` against `task.answer` by `task.answer_type` (rule-based types).

    "judge" tasks need a model call: grade them with `rewards.judge.grade`,
    which also accepts every rule-based type.
    """
    answer_type = task.answer_type
    if answer_type not in ANSWER_TYPES:
        raise ValueError(f"unknown answer_type {answer_type!r}; expected one of {ANSWER_TYPES}")
    if answer_type == "environment":
        raise ValueError(
            f"task {getattr(task, 'id', '?')!r} is graded by its environment (answer_type "
            "'environment'), not by its answer: play it in that environment (task.metadata['env'])"
        )
    if prediction is None or not is_valid_answer(prediction):
        return False
    if answer_type == "exact":
        return exact_match(prediction, task.answer)
    if answer_type == "numeric":
        return numeric_match(prediction, task.answer)
    if answer_type == "math":
        verdict = math_match(prediction, task.answer)
        if verdict is not None:
            return verdict
        return numeric_match(prediction, task.answer) or exact_match(prediction, task.answer)
    raise ValueError(
        f"task {getattr(task, 'id', '?')!r} has answer_type 'judge': it needs an LLM "
        "judge; use `orchestra_jax.rewards.judge.grade(prediction, task, judge=...)`"
    )


def outcome_rewards(
    features: Sequence[Mapping[str, float]],
    correct: Sequence[bool],
    preference: Mapping[str, float] | None = None,
) -> np.ndarray:
    """R_i = 1 if episode i is correct else 0 (the plain outcome reward, for ablations).

    Same group signature as the other registered rewards; features and preference
    are ignored.
    """
    del features, preference
    return np.asarray(correct, dtype=bool).astype(np.float32)
