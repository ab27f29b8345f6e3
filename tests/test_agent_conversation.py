"""Conversations in the agent loop: another party's turns, token-exact, failures kept.

`FakeUser` is an `OtherParty`: it opens with a greeting and a first message,
answers each message the policy sends it, and may end the conversation, fail,
or report what it spent. The policy is a `ScriptedEngine`, or a tiny random
Qwen3 whose rollout log-probabilities are checked against a full forward pass.
"""

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchestra_jax.agent.conversation import OtherParty, PartyReply, message_text
from orchestra_jax.agent.loop import EpisodeSpec, LoopLimits, run_episodes_sync
from orchestra_jax.chat.template import render
from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.rollout.engine import SamplingParams
from orchestra_jax.rollout.scripted import ScriptedEngine
from orchestra_jax.tasks import Task
from tests.test_agent_loop import FakeConfig, FakeTool, call

TOK = load_tokenizer("demo")
OPENING = [
    {"role": "system", "content": "Help the customer."},
    {"role": "assistant", "content": "Hi! How can I help you today?"},
    {"role": "user", "content": "My order is late."},
]


class Config(FakeConfig):
    """`FakeConfig` whose system prompt takes the conversation's head."""

    def system_prompt(self, head="You orchestrate tools."):
        return head + "\n\nBe brief."


class FakeUser:
    """Answers message k with replies[k]; ends after the last, or when `end_after`
    says so; `fail_on` makes that call raise; each reply costs `cost` dollars."""

    def __init__(
        self,
        replies=("Thanks.",),
        *,
        opening=OPENING,
        end_at_open=None,
        fail_on=None,
        end_after_tools=False,
        cost=0.0,
    ):
        self.replies, self.opening = list(replies), opening
        self.end_at_open, self.fail_on, self.cost = end_at_open, fail_on, cost
        self.end_after_tools = end_after_tools
        self.turns = []

    async def open(self, state):
        if self.fail_on == "open":
            raise ConnectionError("user endpoint down")
        return PartyReply(
            messages=list(self.opening),
            end=self.end_at_open,
            calls=1,
            prompt_tokens=10,
            completion_tokens=5,
            cost_usd=self.cost,
            latency_s=1.0,
        )

    async def respond(self, state, turn):
        self.turns.append(turn)
        if self.fail_on == len(self.turns):
            raise ConnectionError("user endpoint died")
        if not turn.is_message:
            return PartyReply(end="budget" if self.end_after_tools else None)
        said = sum(t.is_message for t in self.turns)
        if said > len(self.replies):
            return PartyReply(end="user_stop", calls=1, cost_usd=self.cost)
        return PartyReply(
            messages=[{"role": "user", "content": self.replies[said - 1]}],
            calls=1,
            prompt_tokens=20,
            completion_tokens=3,
            cost_usd=self.cost,
            latency_s=2.0,
        )


def conversation(party, tools=(), seed=0):
    tools = list(tools)
    task = Task(id="c0", question="(hidden from the policy)", answer="", answer_type="environment")
    return EpisodeSpec(
        task=task, tool_config=Config(tools), tools=tools, seed=seed, other_party=party
    )


def scripted(turns, logprob=lambda turn, i: -0.5 - turn - i / 100):
    def policy(ids, request):
        turn = int(request.request_id.rsplit("/", 1)[1])
        out = TOK.encode(turns[min(turn, len(turns) - 1)]) + [TOK.im_end_id]
        return out, [logprob(turn, i) for i in range(len(out))]

    return ScriptedEngine(policy)


def play(spec, engine, **limits):
    limits = {"enable_thinking": True, **limits}
    [traj] = run_episodes_sync(
        [spec], engine, TOK, sampling=SamplingParams(), limits=LoopLimits(**limits)
    )
    return traj


def test_fake_user_is_an_other_party():
    assert isinstance(FakeUser(), OtherParty)


def test_messages_and_tool_calls_in_one_conversation_render_as_the_template_does():
    search = FakeTool("search", "order #1 ships tomorrow")
    user = FakeUser(["It is order #1.", "Great."])
    turns = [
        "Which order?",
        call("search", q="#1"),
        "It ships tomorrow.",
        "<think>\nask more\n</think>\n\nAnything else?",
    ]
    traj = play(conversation(user, [search]), scripted(turns))
    assert traj.finish_reason == "conversation" and traj.metadata["conversation_end"] == "user_stop"
    assert [t.is_message for t in user.turns] == [True, False, True, True]
    assert user.turns[3].content == "Anything else?"  # reasoning is not said to the user
    assert all(t.format_valid for t in traj.turns) and traj.format_valid
    # Token-exact: the whole sequence is the render of the conversation (thinking on,
    # raw assistant text, reasoning only after the last user message: where a user
    # message follows reasoning a re-render drops it, chat/template.py), sampled
    # tokens carry their log-probs, everything else has mask 0.
    messages = [
        {
            "role": "system",
            "content": Config([search]).system_prompt(head="Help the customer."),
        },
        *OPENING[1:],
        {"role": "assistant", "content": turns[0]},
        {"role": "user", "content": "It is order #1."},
        {"role": "assistant", "content": turns[1]},
        {"role": "tool", "content": "order #1 ships tomorrow"},
        {"role": "assistant", "content": turns[2]},
        {"role": "user", "content": "Great."},
    ]
    prompt = render(messages, tools=[search.schema()], add_generation_prompt=True)
    assert TOK.decode(traj.token_ids) == prompt + turns[3] + "<|im_end|>"
    sampled = [i for i, m in enumerate(traj.loss_mask) if m]
    expected_ids = sum((TOK.encode(t) + [TOK.im_end_id] for t in turns), [])
    assert [traj.token_ids[i] for i in sampled] == expected_ids
    lengths = [len(TOK.encode(t)) + 1 for t in turns]
    expected_lp = [-0.5 - k - i / 100 for k, n in enumerate(lengths) for i in range(n)]
    assert [traj.rollout_logprobs[i] for i in sampled] == pytest.approx(expected_lp)
    assert not any(lp for lp, m in zip(traj.rollout_logprobs, traj.loss_mask) if not m)
    assert (
        traj.turns[0].observation == "\n<|im_start|>user\nIt is order #1.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_the_party_spends_apart_from_the_policy():
    user = FakeUser(["ok"], cost=0.25)
    traj = play(conversation(user), scripted(["Hello.", "Bye."]))
    spent = traj.metadata["other_party"]
    assert spent["calls"] == 3 and spent["cost_usd"] == pytest.approx(0.75)
    assert spent["prompt_tokens"] == 30 and spent["latency_s"] == pytest.approx(3.0)
    assert traj.cost_usd == pytest.approx(traj.orchestrator_cost_usd)  # no user dollars
    assert traj.latency_s == pytest.approx(sum(t.generation_latency_s for t in traj.turns))


def test_a_party_that_ends_or_fails_ends_the_episode_and_keeps_what_was_sampled():
    ended = play(conversation(FakeUser(end_at_open="user_stop")), scripted(["Hello."]))
    assert ended.finish_reason == "conversation" and ended.turns == []
    assert ended.metadata["conversation_end"] == "user_stop"
    down = play(conversation(FakeUser(fail_on="open")), scripted(["Hello."]))
    assert down.finish_reason == "error" and down.turns == []
    assert "failed to open" in down.metadata["error"] and "endpoint down" in down.metadata["error"]
    assert down.prompt_length == len(down.token_ids) > 0
    died = play(conversation(FakeUser(["a", "b", "c"], fail_on=2)), scripted(["One.", "Two."]))
    assert died.finish_reason == "error" and "endpoint died" in died.metadata["error"]
    assert len(died.turns) == 2 and sum(died.loss_mask) == sum(
        t.num_generated_tokens for t in died.turns
    )
    budget = play(
        conversation(FakeUser(end_after_tools=True), [FakeTool("search")]),
        scripted([call("search", q="x")]),
    )
    assert budget.metadata["conversation_end"] == "budget" and len(budget.turns) == 1
    assert budget.turns[0].observation == ""  # nothing after the last turn


def test_a_user_message_past_the_context_budget_ends_the_episode():
    long = "word " * 3000
    traj = play(conversation(FakeUser([long])), scripted(["Hello."]), max_context_tokens=1024)
    assert traj.finish_reason == "context" and len(traj.turns) == 1
    assert len(traj.token_ids) <= 1024


def test_message_text_drops_reasoning_and_the_end_token():
    assert message_text("<think>\nhm\n</think>\n\nHi there.<|im_end|>") == "Hi there."
    assert message_text("  plain  ") == "plain"


def test_a_tiny_models_rollout_logprobs_match_a_full_forward_over_user_turns():
    from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
    from orchestra_jax.rollout.jax.engine import JaxEngine, JaxEngineConfig

    config = Qwen3Config.preset("tiny", vocab_size=TOK.vocab_size)
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    engine = JaxEngine(
        model,
        JaxEngineConfig(
            max_batch_size=1,
            max_seq_len=160,
            steps_per_call=8,
            min_cache_len=160,
            min_prefill_len=160,
            min_prefill_rows=1,
            prefix_cache=False,
        ),
    )
    try:
        user = FakeUser(["Yes.", "No.", "Maybe."])
        traj = play(conversation(user), engine, max_turns=3, max_new_tokens_per_turn=6)
    finally:
        engine.close()
    assert len(traj.turns) == 3 and sum(t.is_message for t in user.turns) >= 1
    ids = jnp.asarray([traj.token_ids], jnp.int32)
    logits = model(ids, jnp.arange(ids.shape[1])[None])[0]
    logprobs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    mask = np.asarray(traj.loss_mask, bool)
    positions = np.flatnonzero(mask)
    recomputed = np.asarray(logprobs[positions - 1, np.asarray(traj.token_ids)[positions]])
    np.testing.assert_allclose(recomputed, np.asarray(traj.rollout_logprobs)[mask], atol=2e-4)
    assert asyncio.iscoroutinefunction(FakeUser.respond)
