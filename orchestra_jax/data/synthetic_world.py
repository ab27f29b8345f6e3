"""Seeded generators for the synthetic environment (pure functions of an rng).

Three task families, each with a different right tool:
  arithmetic:  exact integer expressions (the code tool computes them);
  entity_fact: facts about invented organisations, stated only in a generated
               corpus (search finds them; then any model can read them off);
  logic:       ordering puzzles (only a strong reasoning model solves them).
"""

from __future__ import annotations

import dataclasses

import numpy as np

SYLLABLES = (
    "ka",
    "lo",
    "mi",
    "ren",
    "tor",
    "va",
    "sel",
    "dun",
    "bri",
    "quo",
    "zan",
    "pel",
    "mor",
    "thi",
    "gal",
    "nes",
    "vik",
    "ora",
    "lum",
    "cas",
    "dre",
    "fen",
    "hal",
    "jus",
    "ket",
    "nor",
    "pry",
    "sul",
    "wex",
    "yan",
)
ORG_KINDS = (
    "Industries",
    "Institute",
    "Foundation",
    "Laboratories",
    "Collective",
    "Works",
    "Observatory",
    "Guild",
)
ATTRIBUTES = {
    # attribute: (question template, sentence template)
    "founded": ("In which year was {name} founded?", "{name} was founded in {value}."),
    "city": ("In which city is {name} headquartered?", "{name} is headquartered in {value}."),
    "founder": ("Who founded {name}?", "{name} was founded by {value}."),
    "members": ("How many members does {name} have?", "{name} has {value} members."),
}


def make_name(rng: np.random.Generator, syllables: int = 3) -> str:
    """A capitalised pseudo-word such as 'Torvasel'."""
    return "".join(rng.choice(SYLLABLES, size=syllables)).capitalize()


@dataclasses.dataclass(frozen=True)
class Entity:
    """An invented organisation; `facts` maps attribute -> value string."""

    id: str
    name: str
    facts: dict[str, str]

    def sentence(self, attribute: str) -> str:
        return ATTRIBUTES[attribute][1].format(name=self.name, value=self.facts[attribute])

    def document_text(self) -> str:
        return " ".join(self.sentence(a) for a in ATTRIBUTES)


def make_entities(rng: np.random.Generator, n: int) -> list[Entity]:
    """`n` organisations with unique names and random facts."""
    names: set[str] = set()
    entities = []
    while len(entities) < n:
        name = f"{make_name(rng)} {rng.choice(ORG_KINDS)}"
        if name in names:
            continue
        names.add(name)
        facts = {
            "founded": str(int(rng.integers(1650, 2020))),
            "city": make_name(rng, 2) + rng.choice(["ton", "burg", "ford", "holm"]),
            "founder": f"{make_name(rng, 2)} {make_name(rng, 3)}",
            "members": str(int(rng.integers(12, 98000))),
        }
        entities.append(Entity(id=f"ent{len(entities):05d}", name=name, facts=facts))
    return entities


def arithmetic_problem(rng: np.random.Generator) -> tuple[str, str, list[str]]:
    """(question, expression, wrong expressions) for an exact integer sum.

    The expression is Python; its value is the answer. Wrong expressions are
    the slips a weak coder makes (an operator or an operand changed).
    """
    a, b = int(rng.integers(1000, 9999)), int(rng.integers(100, 999))
    c, m = int(rng.integers(1000, 99999)), int(rng.integers(97, 997))
    form = int(rng.integers(3))
    if form == 0:
        expr = f"({a} * {b} - {c}) % {m}"
        question = f"Compute ({a} × {b} − {c}) mod {m}."
        wrong = [
            f"({a} * {b} + {c}) % {m}",
            f"({a} * {b} - {c}) % {m + 1}",
            f"({a} * {b - 1} - {c}) % {m}",
        ]
    elif form == 1:
        expr = f"{a} * {b} + {c} * {m}"
        question = f"What is {a} × {b} + {c} × {m}?"
        wrong = [
            f"{a} * {b} + {c} * {m - 1}",
            f"{a} * {b + 1} + {c} * {m}",
            f"{a} + {b} + {c} * {m}",
        ]
    else:
        expr = f"sum(i * i for i in range(1, {b} + 1)) % {a}"
        question = f"What is the sum of the squares of 1 to {b}, modulo {a}?"
        wrong = [
            f"sum(i * i for i in range(1, {b})) % {a}",
            f"sum(i for i in range(1, {b} + 1)) % {a}",
            f"sum(i * i for i in range(1, {b} + 1)) % {a + 1}",
        ]
    return question, expr, wrong


def logic_puzzle(rng: np.random.Generator, size: int = 5) -> tuple[str, str, list[str]]:
    """(question, answer, names): a finishing order pinned down by shuffled
    'X finished right before Y' clues; asks who finished at a random place."""
    names: list[str] = []
    while len(names) < size:
        name = make_name(rng, 2)
        if name not in names:
            names.append(name)
    order = [names[i] for i in rng.permutation(size)]
    clues = [f"{order[i]} finished right before {order[i + 1]}" for i in range(size - 1)]
    clues = [clues[i] for i in rng.permutation(len(clues))]
    place = int(rng.integers(size))
    ordinal = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh")[place]
    question = (
        f"{', '.join(sorted(names))} ran a race with no ties. "
        + "; ".join(clues)
        + f". Who finished {ordinal}?"
    )
    return question, order[place], names
