"""Context policies: the reference's rebuilt per-turn prompt, text by text, and the
loop giving the engine exactly those ids.

Expected texts are written by hand from the reference's format
(`generation_quick3.py`, `run_llm_loop`, category "qa"): "Problem: {question}\\n\\n
{context}\\n\\n{instruction}" after the system line, documents as "Doc i: {first
4000 characters}\\n\\n" in merge order, programs as ```python / ```output blocks,
left cuts by tokens, the rendered prompt's middle dropped. A character tokenizer
makes every budget a count of characters.
"""

import dataclasses

import pytest

from orchestra_jax.agent.context import (
    HistoryContext,
    RebuildBudgets,
    RebuildContext,
    context_policy,
    conversation_prompt_messages,
    cut_middle_messages,
    episode_evidence,
    merge_documents,
    middle_truncate,
    rebuild_messages,
)
from orchestra_jax.agent.trajectory import ToolResultRecord, Turn
from orchestra_jax.chat.template import render
from tests.test_agent_loop import TOK, FakeTool, call, run, scripted, spec

INSTRUCTION = "\n\nChoose an approriate tool."


class CharTokenizer:
    """One token per character."""

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids, *, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


CHARS = CharTokenizer()
PROGRAM = "```python\nprint(1)\n```\n\n```output\n1\n```\n\n"  # 41 characters


def user_text(messages):
    assert messages[0] == {"role": "system", "content": "You are good at using tools. "}
    assert [m["role"] for m in messages] == ["system", "user"]
    return messages[1]["content"]


def test_merge_documents_interleaves_new_documents_in_front():
    assert merge_documents([], ["a", "b"]) == ["a", "b"]
    assert merge_documents(["a"], []) == ["a"]
    # Fewer older than newer: older + newer, as they are.
    assert merge_documents(["b", "a"], ["e", "d", "c"]) == ["b", "a", "e", "d", "c"]
    # m = 5 // 1 older documents after each new one.
    assert merge_documents(["b", "a", "e", "d", "c"], ["f"]) == ["f", "b", "a", "e", "d", "c"]
    # m = 2; a document already placed is not repeated; the rest follows as it is.
    assert merge_documents(["x", "y", "z", "w", "v"], ["y", "q"]) == ["y", "x", "q", "z", "w", "v"]


def result(**metadata):
    return ToolResultRecord(text="(shown)", metadata=metadata)


def recorded_turns():
    """Three turns of a QA episode: a search, a program with a search, a blank program."""
    t0 = Turn(text="", num_generated_tokens=1, finish_reason="stop")
    t0.tool_results = [result(documents=["a" * 4500 + "END", "second doc"])]
    t1 = Turn(text="", num_generated_tokens=1, finish_reason="stop")
    t1.tool_results = [
        result(code="print(6*7)", output="42\n"),
        result(documents=["third", "fourth", "fifth"]),
    ]
    t2 = Turn(text="", num_generated_tokens=1, finish_reason="stop")
    t2.tool_results = [result(code="pass", output="  \n"), result(text_only=True)]
    return [t0, t1, t2]


def test_evidence_of_recorded_turns():
    docs, code = episode_evidence(recorded_turns())
    # Each search's results reversed; turn 1's three in front of turn 0's two: 2 < 3,
    # so older + newer. A blank program output is left out.
    assert docs == ["second doc", "a" * 4500 + "END", "fifth", "fourth", "third"]
    assert code == [("print(6*7)", "42\n")]
    assert episode_evidence([]) == ([], [])


def test_rebuilt_text_of_recorded_turns_with_the_reference_budgets():
    docs, code = episode_evidence(recorded_turns())
    text = user_text(rebuild_messages("What is 6*7?", docs, code, CHARS))
    assert (
        text
        == (
            "Problem: What is 6*7?\n\nDocuments:\n"
            "Doc 1: second doc\n\n"
            "Doc 2: " + "a" * 4000 + "\n\n"  # each document's first 4,000 characters
            "Doc 3: fifth\n\nDoc 4: fourth\n\nDoc 5: third\n\n"
            "```python\nprint(6*7)\n```\n\n```output\n42\n\n```\n\n" + INSTRUCTION
        )
    )


def test_first_turn_and_code_only_texts():
    assert user_text(rebuild_messages("Q?", [], [], CHARS)) == "Problem: Q?\n\n" + INSTRUCTION
    assert (
        user_text(rebuild_messages("Q?", [], [("print(1)", "1")], CHARS))
        == "Problem: Q?\n\n" + PROGRAM + INSTRUCTION
    )


def test_programs_over_their_budget_keep_their_tail_and_push_out_the_documents():
    budgets = RebuildBudgets(doc_chars=5, code_tokens=30, context_tokens=40)
    text = user_text(
        rebuild_messages("Q?", ["abcdefgh", "xy"], [("print(1)", "1")], CHARS, budgets)
    )
    # 41 > 30: the last 30 characters, the fence put back; no documents at all.
    assert text == "Problem: Q?\n\n```\nrint(1)\n```\n\n```output\n1\n```\n\n" + INSTRUCTION


def test_documents_and_programs_are_cut_from_the_left_together():
    budgets = RebuildBudgets(doc_chars=5, code_tokens=100, context_tokens=40)
    docs = ["abcdefgh", "xy"]  # "Doc 1: abcde\n\nDoc 2: xy\n\n": 25 characters
    text = user_text(rebuild_messages("Q?", docs, [("print(1)", "1")], CHARS, budgets))
    # 25 + 41 = 66 > 40: the first 26 go (the documents and one backtick).
    assert text == "Problem: Q?\n\nDocuments:\n``python\nprint(1)\n```\n\n```output\n1\n```\n\n" + (
        INSTRUCTION
    )
    roomy = dataclasses.replace(budgets, context_tokens=66)
    text = user_text(rebuild_messages("Q?", docs, [("print(1)", "1")], CHARS, roomy))
    assert (
        text == "Problem: Q?\n\nDocuments:\nDoc 1: abcde\n\nDoc 2: xy\n\n" + PROGRAM + INSTRUCTION
    )


def test_the_rendered_prompt_loses_its_middle():
    assert middle_truncate([1, 2, 3], 3) == [1, 2, 3]
    assert middle_truncate(list(range(10)), 5) == [0, 1, 7, 8, 9]
    s = spec([FakeTool("search")])
    turns = recorded_turns()
    whole = RebuildContext().prompt(s, CHARS, turns, enable_thinking=True)
    docs, code = episode_evidence(turns)
    want = render(
        rebuild_messages(s.task.question, docs, code, CHARS),
        tools=s.tool_schemas(),
        add_generation_prompt=True,
        enable_thinking=True,
    )
    assert CHARS.decode(whole) == want
    cut = RebuildContext(RebuildBudgets(prompt_tokens=60)).prompt(
        s, CHARS, turns, enable_thinking=True
    )
    assert CHARS.decode(cut) == want[:30] + want[-30:]


class EvidenceTool(FakeTool):
    """A FakeTool whose result carries the metadata the rebuilt prompt reads."""

    def __init__(self, name, metadata, **kwargs):
        super().__init__(name, **kwargs)
        self.metadata = metadata

    async def __call__(self, arguments, ctx):
        out = await super().__call__(arguments, ctx)
        return dataclasses.replace(out, metadata=dict(self.metadata))


def rebuild_episode(context=None):
    tools = [
        EvidenceTool("search", {"documents": ["doc one", "doc two"]}, text="found"),
        EvidenceTool("enhance_reasoning", {"code": "print(2)", "output": "2"}, text="ran"),
        FakeTool("answer", final=True),
    ]
    script = [call("search", q="x"), call("enhance_reasoning", q="y"), call("answer", q="42")]
    engine = scripted({"t0/0": script})
    [traj] = run([spec(tools)], engine, context=context or RebuildContext())
    requests = [list(r.input_ids) for r in engine.requests]
    return traj, requests, script


def test_the_loop_gives_the_engine_the_rebuilt_prompts_and_records_them():
    traj, requests, script = rebuild_episode()
    assert traj.finish_reason == "answer" and len(traj.turns) == 3 == len(requests)
    s = spec([FakeTool("search"), FakeTool("enhance_reasoning"), FakeTool("answer")])
    texts = [
        "Problem: What is t0?\n\n" + INSTRUCTION,
        "Problem: What is t0?\n\nDocuments:\nDoc 1: doc two\n\nDoc 2: doc one\n\n" + INSTRUCTION,
        "Problem: What is t0?\n\nDocuments:\nDoc 1: doc two\n\nDoc 2: doc one\n\n"
        "```python\nprint(2)\n```\n\n```output\n2\n```\n\n" + INSTRUCTION,
    ]
    for k, (turn, ids, text) in enumerate(zip(traj.turns, requests, texts)):
        messages = [
            {"role": "system", "content": "You are good at using tools. "},
            {"role": "user", "content": text},
        ]
        want = render(messages, tools=s.tool_schemas(), add_generation_prompt=True)
        assert TOK.decode(ids) == want, k
        # Token-exact: the trajectory holds the prompt the engine read, then what it wrote.
        start, p, n = turn.prompt_start, turn.prompt_tokens, turn.num_generated_tokens
        assert traj.token_ids[start : start + p] == ids and p == len(ids)
        assert traj.token_ids[start + p : start + p + n] == TOK.encode(script[k] + "<|im_end|>")
        assert traj.loss_mask[start : start + p] == [0] * p
        assert traj.loss_mask[start + p : start + p + n] == [1] * n
        assert not turn.observation  # nothing is appended: the next prompt is rebuilt
    ends = [t.prompt_start + t.prompt_tokens + t.num_generated_tokens for t in traj.turns]
    assert [t.prompt_start for t in traj.turns] == [0] + ends[:-1]
    assert ends[-1] == len(traj.token_ids)


def test_history_is_the_default_and_rebuild_needs_a_conversations_messages():
    assert context_policy(type("A", (), {"context": "history"})()) == HistoryContext()
    own = type("A", (), {"context": "orchestra_jax.agent.context:rebuild_context"})()
    assert context_policy(own) == RebuildContext()  # "package.module:attr" works too
    with pytest.raises(ValueError, match="history"):
        HistoryContext().prompt(spec([]), TOK, recorded_turns(), enable_thinking=True)
    s = dataclasses.replace(spec([FakeTool("answer", final=True)]), other_party=object())
    with pytest.raises(ValueError, match="needs its messages"):
        RebuildContext().prompt(s, TOK, [], enable_thinking=True)


def test_cut_middle_messages_keeps_the_whole_messages_at_either_end():
    # Ends at 3, 7, 12, 14, 20 tokens (T = 20).
    lengths = [3, 4, 5, 2, 6]
    assert cut_middle_messages(lengths, 20) == [0, 1, 2, 3, 4]  # it fits
    # Budget 10: the first 5 tokens hold message 0; the last 5 start at token 15,
    # inside message 4.
    assert cut_middle_messages(lengths, 10) == [0, 4]
    # Budget 11: the last 6 start at token 14, message 4's first.
    assert cut_middle_messages(lengths, 11) == [0, 4]
    # Budget 13: the last 7 start at token 13, inside message 3.
    assert cut_middle_messages(lengths, 13) == [0, 3, 4]
    # Budget 14: the first 7 hold messages 0 and 1.
    assert cut_middle_messages(lengths, 14) == [0, 1, 3, 4]
    # No room at all: the last message, as a budget of 1 keeps it.
    assert cut_middle_messages(lengths, 0) == [4]


class WordTokenizer:
    """One token a whitespace-separated word: lengths a reader can count."""

    def encode(self, text):
        return text.split()


def test_a_conversations_messages_are_cut_to_its_budget_less_the_tools():
    messages = [
        {"role": "system", "content": "s1 s2 s3 s4 s5"},  # 6 words rendered
        {"role": "user", "content": "u1"},  # 2
        {"role": "assistant", "content": "a1 a2 a3"},  # 4
        {"role": "tool", "content": "r1"},  # 4: <tool_response> and its close
        {"role": "user", "content": "u2 u3"},  # 3
        {"role": "assistant", "content": "b1"},  # 2
        {"role": "user", "content": "u4 u5 u6"},  # 4; ends at 6, 8, 12, 16, 19, 21, 25
    ]
    words = WordTokenizer()
    budgets = RebuildBudgets(conversation_tokens=25)
    assert conversation_prompt_messages(messages, [], words, budgets) == messages
    # 16: the first 8 tokens hold the system prompt and "u1"; the last 8 start at
    # token 17, inside "u2 u3".
    budgets = RebuildBudgets(conversation_tokens=16)
    kept = conversation_prompt_messages(messages, [], words, budgets)
    assert [m["content"] for m in kept] == ["s1 s2 s3 s4 s5", "u1", "u2 u3", "b1", "u4 u5 u6"]
    # The tools' JSON, '[{"name": "f"}]', is two words: 14 are left, so "u1" goes.
    kept = conversation_prompt_messages(messages, [{"name": "f"}], words, budgets)
    assert [m["content"] for m in kept] == ["s1 s2 s3 s4 s5", "u2 u3", "b1", "u4 u5 u6"]
