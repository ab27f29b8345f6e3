"""Tasks: what the orchestrator is asked, and how its answer is checked.

A `Task` is plain data that every room reads: the agent loop renders
`question`, the reward room compares the final answer with `answer` according
to `answer_type`, and tools (simulated experts, retrieval) read `metadata`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

ANSWER_TYPES = ("exact", "numeric", "math", "judge", "environment")


@dataclasses.dataclass(frozen=True)
class Task:
    """One question with a verifiable answer.

    Attributes:
      id: unique, stable id (seeded generators give the same id for the same task).
      question: the text shown to the orchestrator.
      answer: the gold answer as a string.
      answer_type: how the answer is checked: "exact" (normalised string match),
        "numeric" (numbers compared with a tolerance), "math" (math-verify
        equivalence), "judge" (an LLM judge) or "environment" (the task's
        environment grades the whole episode, e.g. τ²-bench's evaluator).
      domain: a short name for the kind of task ("arithmetic", "entity_fact", …);
        simulated experts look their skill up by it and metrics group by it.
      metadata: free-form extras. Keys the tools room reads:
        "allowed_doc_ids" (list[str]): restricts retrieval for this task;
        "evidence" (str): text whose presence in the episode's documents or notes
          means the needed evidence has been gathered (simulated experts);
        "search_query" (str): the query a skilled search model would write;
        "expression" (str): a Python expression whose value is the answer
          (what a skilled code-writing model would compute);
        "distractors" (list[str]): plausible wrong answers.
    """

    id: str
    question: str
    answer: str
    answer_type: str = "exact"
    domain: str = "general"
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.answer_type not in ANSWER_TYPES:
            raise ValueError(
                f"Task {self.id!r}: answer_type must be one of {ANSWER_TYPES}, "
                f"got {self.answer_type!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Task:
        return cls(**d)


@runtime_checkable
class TaskSource(Protocol):
    """Anything that hands out tasks by split ("train", "heldout", …)."""

    def tasks(self, split: str, n: int) -> list[Task]:
        """Returns `n` tasks of `split`, deterministically for a fixed source."""
        ...
