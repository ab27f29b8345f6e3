"""The OpenAI-compatible endpoint through the official `openai` client.

Tool calls and reasoning are parsed as SGLang's qwen25 / qwen3 parsers do (a
scripted engine writes the replies); sampling fields (logprobs, stop, n, seeds,
max_tokens 0) run on a tiny Qwen3; what the server cannot do is a 400 naming the field.
"""

import json

import pytest
from flax import nnx

from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.chat.tool_calls import ToolCall, parse_tool_calls
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.rollout.jax.engine import JaxEngine, JaxEngineConfig
from orchestra_jax.rollout.scripted import ScriptedEngine
from orchestra_jax.rollout.server.app import ServerConfig, serve_in_thread
from orchestra_jax.rollout.server.openai_chat import _without_calls, split_reply
from tests.linear_time import LINEAR_BOUND, growth

openai = pytest.importorskip("openai")

SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search with a model.",
        "parameters": {"type": "object", "properties": {"model": {"type": "string"}}},
    },
}
CALL = '<tool_call>\n{"name": "search", "arguments": {"model": "search-1"}}\n</tool_call>'
REPLIES = {  # the last user message -> what the scripted model writes
    "call a tool": f"<think>\nI should search.\n</think>\n\nLet me look.\n{CALL}<|im_end|>",
    "reason please": "<think>\nplan it\n</think>\n\nThe answer is 4.<|im_end|>",
    "call an unknown tool": '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>'
    + "<|im_end|>",
}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("demo")


def script(tokenizer):
    def policy(ids, request):
        prompt = tokenizer.decode(ids)
        if prompt.endswith('{"name": "search", "arguments": '):  # a named tool_choice
            return tokenizer.encode('{"model": "search-2"}}\n</tool_call><|im_end|>')
        if prompt.endswith("<tool_call>\n"):  # tool_choice "required"
            return tokenizer.encode(CALL.removeprefix("<tool_call>\n") + "<|im_end|>")
        for key, reply in REPLIES.items():
            if f"{key}<|im_end|>" in prompt:
                return tokenizer.encode(reply)
        return tokenizer.encode("hello<|im_end|>")

    return policy


@pytest.fixture(scope="module")
def scripted(tokenizer):
    engine = ScriptedEngine(script(tokenizer))
    with serve_in_thread(engine, ServerConfig(model_path="scripted"), tokenizer=tokenizer) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        yield client, engine


def ask(client, text, **kw):
    messages = [{"role": "user", "content": text}]
    return client.chat.completions.create(model="scripted", messages=messages, **kw)


def test_tool_calls_and_reasoning_are_parsed(scripted):
    client, _ = scripted
    reply = ask(client, "call a tool", tools=[SEARCH])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "search"
    assert json.loads(call.function.arguments) == {"model": "search-1"} and call.id
    assert choice.message.content == "Let me look."
    assert choice.message.reasoning_content == "I should search."
    assert reply.usage.completion_tokens > 0


def test_reasoning_without_tools(scripted):
    client, _ = scripted
    choice = ask(client, "reason please").choices[0]
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert choice.message.content == "The answer is 4."
    assert choice.message.reasoning_content == "plan it"


def test_tool_choice(scripted, tokenizer):
    client, engine = scripted
    none = ask(client, "call a tool", tools=[SEARCH], tool_choice="none").choices[0]
    assert none.finish_reason == "stop" and none.message.tool_calls is None
    assert "<tool_call>" in none.message.content
    assert "<tools>" not in tokenizer.decode(engine.requests[-1].input_ids)  # tools not shown
    required = ask(client, "hi", tools=[SEARCH], tool_choice="required").choices[0]
    assert required.finish_reason == "tool_calls"
    assert json.loads(required.message.tool_calls[0].function.arguments) == {"model": "search-1"}
    named = {"type": "function", "function": {"name": "search"}}
    choice = ask(client, "hi", tools=[SEARCH], tool_choice=named).choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "search" and json.loads(call.function.arguments) == {
        "model": "search-2"
    }
    unknown = ask(client, "call an unknown tool", tools=[SEARCH]).choices[0]
    assert unknown.message.tool_calls is None and '"nope"' in unknown.message.content


def test_messages_in_every_accepted_form(scripted, tokenizer):
    client, engine = scripted
    messages = [
        {"role": "developer", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "two"}],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "search", "arguments": '{"model": "search-1"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
    ]
    reply = client.chat.completions.create(model="m", messages=messages, tools=[SEARCH], n=2)
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.usage.completion_tokens == 2 * len(tokenizer.encode("hello<|im_end|>"))
    prompt = tokenizer.decode(engine.requests[-1].input_ids)
    assert "<|im_start|>system\nBe brief." in prompt and "part one two" in prompt
    assert "<tool_response>\nfound\n</tool_response>" in prompt


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"stream": True}, "stream"),
        ({"seed": 1.5}, "seed"),
        ({"temperature": [1]}, "temperature"),
        ({"tools": 5}, "tools"),
        (
            {"tools": [SEARCH], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        ({"logit_bias": {"5": 1}}, "logit_bias"),
        ({"max_tokens": 2**31}, "context length"),
        ({"max_tokens": -1}, "max_new_tokens"),
        ({"top_logprobs": 50, "logprobs": True}, "top_logprobs"),
    ],
)
def test_what_the_server_cannot_do_is_a_400_naming_it(scripted, kw, field):
    client, _ = scripted
    body = {k: v for k, v in kw.items() if k not in ("seed", "temperature", "tools")}
    extra = {k: v for k, v in kw.items() if k in ("seed", "temperature", "tools")}
    with pytest.raises(openai.BadRequestError) as info:
        ask(client, "hi", extra_body=extra or None, **body)
    assert field in str(info.value)


def test_images_are_refused_by_name(scripted):
    client, _ = scripted
    content = [{"type": "image_url", "image_url": {"url": "data:,"}}]
    with pytest.raises(openai.BadRequestError, match="image_url"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}])


def test_split_reply():
    assert split_reply("<think>\na\n</think>\n\nb") == ("a", "b")
    assert split_reply("no tags") == (None, "no tags")
    assert split_reply("<think>\ncut short") == ("cut short", "")
    assert split_reply("x</think>y</think>z") == ("x", "y</think>z")


@pytest.fixture(scope="module")
def tiny(tokenizer):
    config = Qwen3Config.preset("tiny", vocab_size=tokenizer.vocab_size)
    engine = JaxEngine(
        Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)),
        JaxEngineConfig(max_batch_size=4, max_seq_len=256, steps_per_call=8),
        tokenizer=tokenizer,
    )
    with serve_in_thread(engine, ServerConfig(model_path="tiny"), tokenizer=tokenizer) as s:
        yield openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
    engine.close()


def test_sampling_fields_on_a_model(tiny):
    plain = {"extra_body": {"separate_reasoning": False, "ignore_eos": True}}
    first = ask(tiny, "hi", max_tokens=8, temperature=0, logprobs=True, top_logprobs=2, **plain)
    choice = first.choices[0]
    assert choice.finish_reason == "length" and first.usage.completion_tokens == 8
    assert len(choice.logprobs.content) == 8
    assert all(len(t.top_logprobs) == 2 for t in choice.logprobs.content)
    assert all(t.top_logprobs[0].logprob >= t.logprob - 1e-5 for t in choice.logprobs.content)
    text = choice.message.content
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    stopped = ask(tiny, "hi", max_tokens=8, temperature=0, stop=[stop], **plain).choices[0]
    assert stopped.finish_reason == "stop" and stopped.message.content == text[: text.find(stop)]
    zero = ask(tiny, "hi", max_tokens=0)
    assert zero.choices[0].finish_reason == "length" and zero.usage.completion_tokens == 0
    seeded = [ask(tiny, "hi", max_tokens=6, seed=3, n=2, **plain) for _ in range(2)]
    assert [c.message.content for c in seeded[0].choices] == [
        c.message.content for c in seeded[1].choices
    ]


def calls_removed(content):
    return _without_calls(
        content, [c for c in parse_tool_calls(content) if isinstance(c, ToolCall)]
    )


def test_a_reply_without_its_calls_keeps_the_text_between_them():
    bad = "<tool_call>\nnot json\n</tool_call>"
    assert calls_removed(f"a{CALL}b{CALL}{bad}c{CALL}") == f"ab{bad}c"


def test_removing_calls_takes_time_linear_in_the_reply():
    assert growth(calls_removed, lambda n: f"x{CALL}" * n, 2000) < LINEAR_BOUND
