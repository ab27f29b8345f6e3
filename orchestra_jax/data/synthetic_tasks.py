"""The synthetic world's tasks and corpus: seeded, offline, the same on every machine.

`SyntheticTasks(seed)` generates tasks in three domains (`DOMAINS`; the generators
are `synthetic_world`'s) over a world of invented organisations. Task i of a
split is a function of (seed, split, i) only, so `tasks(split, n)` is a prefix of
`tasks(split, n + 1)`. Entity facts of the train and held-out splits concern
disjoint sets of organisations; the corpus (`corpus_rows`, one row an
organisation) holds all of them. The environment that plays these tasks with
tools is `envs/synthetic.SyntheticOrchestrationEnv`; the reader "synthetic"
(`data/readers.py`) and `tools/build_index.py --synthetic-seed` read them here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

import numpy as np

from orchestra_jax.data import synthetic_world
from orchestra_jax.tasks import Task

DOMAINS = ("arithmetic", "entity_fact", "logic")
SPLITS = {"train": 0, "heldout": 1}


class CorpusRow(TypedDict):
    """One document of the corpus, as a corpus file's row holds it."""

    id: str
    title: str
    text: str


class SyntheticTasks:
    """Seeded task generator and corpus.

    Args:
      seed: everything (entities, tasks) is a function of it.
      num_entities: organisations in the corpus.
      heldout_fraction: share of organisations reserved for held-out questions.
      domain_weights: relative frequency of each domain in `DOMAINS` order.
    """

    def __init__(
        self,
        seed: int = 0,
        *,
        num_entities: int = 400,
        heldout_fraction: float = 0.2,
        domain_weights: Sequence[float] = (1.0, 1.0, 1.0),
    ):
        if (
            len(domain_weights) != len(DOMAINS)
            or min(domain_weights) < 0
            or sum(domain_weights) <= 0
        ):
            raise ValueError(
                f"domain_weights: {len(DOMAINS)} non-negative numbers "
                f"with a positive sum, got {domain_weights}"
            )
        if num_entities < 2 or not 0 < heldout_fraction < 1:
            raise ValueError("need num_entities >= 2 and 0 < heldout_fraction < 1")
        self.seed = seed
        weights = np.asarray(domain_weights, dtype=np.float64)
        self.domain_probs = weights / weights.sum()
        self.entities = synthetic_world.make_entities(
            np.random.default_rng([seed, 7]), num_entities
        )
        n_heldout = max(1, int(round(num_entities * heldout_fraction)))
        self._split_entities = {
            "train": self.entities[:-n_heldout],
            "heldout": self.entities[-n_heldout:],
        }

    # --- tasks -----------------------------------------------------------------

    def tasks(self, split: str, n: int) -> list[Task]:
        """The first `n` tasks of `split` ("train" or "heldout")."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
        return [self.task(split, i) for i in range(n)]

    def task(self, split: str, index: int) -> Task:
        """Task `index` of `split`, generated from (seed, split, index)."""
        rng = np.random.default_rng([self.seed, SPLITS[split], index])
        domain = DOMAINS[int(rng.choice(len(DOMAINS), p=self.domain_probs))]
        task_id = f"synthetic-{self.seed}-{split}-{index}"
        make = {
            "arithmetic": self._arithmetic,
            "entity_fact": self._entity_fact,
            "logic": self._logic,
        }[domain]
        return make(task_id, split, rng)

    def _arithmetic(self, task_id: str, split: str, rng: np.random.Generator) -> Task:
        question, expr, wrong = synthetic_world.arithmetic_problem(rng)
        answer = str(eval(expr, {"__builtins__": {"sum": sum, "range": range}}))  # noqa: S307 (our own expression)
        distractors = [str(int(answer) + d) for d in (-1, 1, 10)]
        return Task(
            task_id,
            question,
            answer,
            "numeric",
            "arithmetic",
            {
                "expression": expr,
                "wrong_expressions": wrong,
                "evidence": f"result = {answer}",
                "distractors": distractors,
                "split": split,
            },
        )

    def _entity_fact(self, task_id: str, split: str, rng: np.random.Generator) -> Task:
        pool = self._split_entities[split]
        entity = pool[int(rng.integers(len(pool)))]
        attribute = list(synthetic_world.ATTRIBUTES)[
            int(rng.integers(len(synthetic_world.ATTRIBUTES)))
        ]
        others = [
            pool[int(i)] for i in rng.choice(len(pool), size=min(4, len(pool)), replace=False)
        ]
        others = [e for e in others if e.id != entity.id][:3]
        question = synthetic_world.ATTRIBUTES[attribute][0].format(name=entity.name)
        return Task(
            task_id,
            question,
            entity.facts[attribute],
            "exact",
            "entity_fact",
            {
                "entity_id": entity.id,
                "attribute": attribute,
                "evidence": entity.sentence(attribute),
                "search_query": f"{entity.name} {attribute}",
                "distractor_queries": [f"{e.name} {attribute}" for e in others],
                "distractors": [e.facts[attribute] for e in others],
                "split": split,
            },
        )

    def _logic(self, task_id: str, split: str, rng: np.random.Generator) -> Task:
        question, answer, names = synthetic_world.logic_puzzle(rng)
        return Task(
            task_id,
            question,
            answer,
            "exact",
            "logic",
            {"distractors": [n for n in names if n != answer], "split": split},
        )

    # --- corpus ------------------------------------------------------------------------

    def corpus_rows(self) -> list[CorpusRow]:
        """One row per organisation (all splits): `id` (the entity id), `title`, `text`."""
        return [CorpusRow(id=e.id, title=e.name, text=e.document_text()) for e in self.entities]
