"""The rollout server against SGLang 0.5.23's own validation, on a table of /generate bodies.

SGLang's verdicts come from its own code (tests/sglang_reference.py loads its JSON
contract, GenerateReqInput and SamplingParams from the `sglang` wheel, installed
with --no-deps); ours from `sglang_protocol.parse_generate`, with the same model
bounds. Every accepted body is then sent to a served tiny Qwen3, and each
response must decode with SGLang's own response schema (a string `meta_info.id`,
the `weight_version`, typed finish reasons and logprob entries).
"""

import asyncio
import json

import aiohttp
import pytest
from flax import nnx

from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.rollout.http import sglang_protocol as proto
from orchestra_jax.rollout.jax.engine import JaxEngine, JaxEngineConfig
from orchestra_jax.rollout.server.app import ServerConfig, serve_in_thread
from tests import sglang_reference

CONTEXT = 16
P = [5, 6]  # a two-token prompt
LONG = list(range(3, 3 + CONTEXT))  # fills the context

ACCEPTED_BY_BOTH = {
    "single": {"input_ids": P},
    "batch": {"input_ids": [P, [7]]},
    "text": {"text": "hello"},
    "text batch": {"text": ["a b", "c"]},
    "n single": {"input_ids": P, "sampling_params": {"n": 2, "max_new_tokens": 3}},
    "n batch": {"input_ids": [P, [7]], "sampling_params": {"n": 3, "max_new_tokens": 2}},
    "stop ids": {"input_ids": P, "sampling_params": {"stop_token_ids": [1, 2]}},
    "20 stop ids": {"input_ids": P, "sampling_params": {"stop_token_ids": list(range(20, 40))}},
    "stop id 2^31": {"input_ids": P, "sampling_params": {"stop_token_ids": [2**31]}},
    "negative stop id": {"input_ids": P, "sampling_params": {"stop_token_ids": [-1]}},
    "stop string": {"input_ids": P, "sampling_params": {"stop": "ab"}},
    "stop strings": {"input_ids": P, "sampling_params": {"stop": ["ab", "c d"]}},
    "min_p": {"input_ids": P, "sampling_params": {"min_p": 0.2}},
    "repetition": {"input_ids": P, "sampling_params": {"repetition_penalty": 1.3}},
    "penalties": {
        "input_ids": P,
        "sampling_params": {"frequency_penalty": 0.5, "presence_penalty": -0.5},
    },
    "ignore_eos": {"input_ids": P, "sampling_params": {"ignore_eos": True}},
    "max_new 0": {"input_ids": P, "sampling_params": {"max_new_tokens": 0}},
    "max_new fills": {"input_ids": P, "sampling_params": {"max_new_tokens": CONTEXT - 2}},
    "logprobs": {"input_ids": P, "return_logprob": True},
    "top logprobs": {"input_ids": P, "return_logprob": True, "top_logprobs_num": 3},
    "prompt logprobs": {"input_ids": P, "return_logprob": True, "logprob_start_len": 0},
    "start = prompt": {"input_ids": P, "return_logprob": True, "logprob_start_len": 2},
    "start past, no logprobs": {"input_ids": P, "logprob_start_len": 9},
    "per-prompt logprob": {"input_ids": [P, [7]], "return_logprob": [True, False]},
    "text in logprobs": {"input_ids": P, "return_logprob": True, "return_text_in_logprobs": True},
    "stream": {"input_ids": P, "stream": True, "sampling_params": {"max_new_tokens": 4}},
    "stream batch": {
        "input_ids": [P, [7]],
        "stream": True,
        "sampling_params": {"max_new_tokens": 3},
    },
    "skip special": {"input_ids": P, "sampling_params": {"skip_special_tokens": True}},
    "trim stop": {"input_ids": P, "sampling_params": {"no_stop_trim": False, "stop": "a"}},
    "spaces": {"input_ids": P, "sampling_params": {"spaces_between_special_tokens": False}},
    "seed": {"input_ids": P, "sampling_params": {"sampling_seed": 7}},
    "negative seed": {"input_ids": P, "sampling_params": {"sampling_seed": -5}},
    "largest seed": {"input_ids": P, "sampling_params": {"sampling_seed": 2**63 - 1}},
    "greedy": {"input_ids": P, "sampling_params": {"temperature": 0}},
    "almost greedy": {"input_ids": P, "sampling_params": {"temperature": 1e-9}},
    "hot": {"input_ids": P, "sampling_params": {"temperature": 100}},
    "top_k -1": {"input_ids": P, "sampling_params": {"top_k": -1}},
    "top_k 1": {"input_ids": P, "sampling_params": {"top_k": 1}},
    "top_k 2^40": {"input_ids": P, "sampling_params": {"top_k": 2**40}},
    "top_p tiny": {"input_ids": P, "sampling_params": {"top_p": 1e-40}},
    "rid": {"input_ids": P, "rid": "abc"},
    "rids": {"input_ids": [P, [7]], "rid": ["x", "y"]},
    "rid prefix": {"input_ids": [P, [7]], "rid": "batch"},
    "unknown top-level field": {"input_ids": P, "foo": 1},
    "null sampling": {"input_ids": P, "sampling_params": None},
    "list sampling": {"input_ids": [P, [7]], "sampling_params": [{"top_k": 2}, {"top_p": 0.5}]},
    "prompt token ids": {"input_ids": P, "return_prompt_token_ids": True},
}

REFUSED_BY_BOTH = {
    "float max_new": {"input_ids": P, "sampling_params": {"max_new_tokens": 2.0}},
    "string max_new": {"input_ids": P, "sampling_params": {"max_new_tokens": "5"}},
    "negative max_new": {"input_ids": P, "sampling_params": {"max_new_tokens": -1}},
    "max_new 2^31": {"input_ids": P, "sampling_params": {"max_new_tokens": 2**31}},
    "past the context": {"input_ids": P, "sampling_params": {"max_new_tokens": CONTEXT - 1}},
    "prompt fills context": {"input_ids": LONG},
    "int rid": {"input_ids": P, "rid": 5},
    "top_k 0": {"input_ids": P, "sampling_params": {"top_k": 0}},
    "top_k -2": {"input_ids": P, "sampling_params": {"top_k": -2}},
    "negative temperature": {"input_ids": P, "sampling_params": {"temperature": -1}},
    "string temperature": {"input_ids": P, "sampling_params": {"temperature": "hot"}},
    "list temperature": {"input_ids": P, "sampling_params": {"temperature": [1]}},
    "top_p 0": {"input_ids": P, "sampling_params": {"top_p": 0}},
    "top_p 1.5": {"input_ids": P, "sampling_params": {"top_p": 1.5}},
    "min_p 1.5": {"input_ids": P, "sampling_params": {"min_p": 1.5}},
    "repetition 0": {"input_ids": P, "sampling_params": {"repetition_penalty": 0}},
    "repetition 2.5": {"input_ids": P, "sampling_params": {"repetition_penalty": 2.5}},
    "frequency 3": {"input_ids": P, "sampling_params": {"frequency_penalty": 3}},
    "33 stop strings": {"input_ids": P, "sampling_params": {"stop": [f"s{i}" for i in range(33)]}},
    "empty input_ids": {"input_ids": []},
    "float ids": {"input_ids": [1.5]},
    "bool ids": {"input_ids": [True]},
    "string ids": {"input_ids": "abc"},
    "no prompt": {"sampling_params": {}},
    "unknown sampling field": {"input_ids": P, "sampling_params": {"bogus": 1}},
    "n differs": {"input_ids": [P, [7]], "sampling_params": [{"n": 2}, {"n": 1}]},
    "list logprob with n": {
        "input_ids": [P, [7]],
        "sampling_params": {"n": 2},
        "return_logprob": [True, True],
    },
    "duplicate rids": {"input_ids": [P, [7]], "rid": ["a", "a"]},
    "rid count": {"input_ids": [P, [7]], "rid": ["a"]},
    "start past prompt": {"input_ids": P, "return_logprob": True, "logprob_start_len": 3},
    "string stream": {"input_ids": P, "stream": "yes"},
    "string return_logprob": {"input_ids": P, "return_logprob": "true"},
    "sampling not an object": {"input_ids": P, "sampling_params": 5},
    "float seed": {"input_ids": P, "sampling_params": {"sampling_seed": 1.5}},
    "float stop id": {"input_ids": P, "sampling_params": {"stop_token_ids": [1.5]}},
    "body not an object": [],
}

# SGLang accepts these, but this server cannot serve them (or they leave the model's
# bounds, which SGLang does not check at the door): refused with a message naming why.
REFUSED_HERE = {
    "id past the vocabulary": ({"input_ids": [5, 10**6]}, "outside the vocabulary"),
    "negative id": ({"input_ids": [5, -3]}, "outside the vocabulary"),
    "regex": ({"input_ids": P, "sampling_params": {"regex": "a+"}}, "regex"),
    "json_schema": ({"input_ids": P, "sampling_params": {"json_schema": "{}"}}, "json_schema"),
    "logit_bias": ({"input_ids": P, "sampling_params": {"logit_bias": {"5": 1.0}}}, "logit_bias"),
    "min_new_tokens": ({"input_ids": P, "sampling_params": {"min_new_tokens": 2}}, "min_new"),
    "image": ({"input_ids": P, "image_data": "x.png"}, "image_data"),
    "lora": ({"input_ids": P, "lora_path": "adapter"}, "lora_path"),
    "top logprobs 50": (
        {"input_ids": P, "return_logprob": True, "top_logprobs_num": 50},
        "top_logprobs_num",
    ),
    "huge batch": ({"input_ids": [[1]] * 1100}, "limit of 1024"),
}


@pytest.fixture(scope="module")
def sglang():
    pytest.importorskip("msgspec")
    try:
        return sglang_reference.load()
    except ImportError as e:
        pytest.skip(f"SGLang {sglang_reference.VERSION} is not installed: {e}")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("demo")


@pytest.fixture(scope="module")
def limits(tokenizer):
    return proto.ServerLimits(
        vocab_size=tokenizer.vocab_size, context_len=CONTEXT, max_top_logprobs=20, can_decode=True
    )


def theirs(sglang, tokenizer, body):
    return sglang_reference.verdict(
        sglang,
        body,
        vocab_size=tokenizer.vocab_size,
        context_len=CONTEXT,
        tokenizer=sglang_reference.Tokenizer(tokenizer),
    )


def ours(limits, tokenizer, body):
    try:
        proto.parse_generate(body, limits, tokenizer.encode)
    except proto.RequestError as e:
        return str(e)
    return None


@pytest.mark.parametrize("name", ACCEPTED_BY_BOTH)
def test_accepted_by_both(sglang, tokenizer, limits, name):
    body = ACCEPTED_BY_BOTH[name]
    assert theirs(sglang, tokenizer, body) is None
    assert ours(limits, tokenizer, body) is None


@pytest.mark.parametrize("name", REFUSED_BY_BOTH)
def test_refused_by_both(sglang, tokenizer, limits, name):
    body = REFUSED_BY_BOTH[name]
    assert theirs(sglang, tokenizer, body) is not None
    assert ours(limits, tokenizer, body) is not None


@pytest.mark.parametrize("name", REFUSED_HERE)
def test_refused_here_with_a_reason(sglang, tokenizer, limits, name):
    body, reason = REFUSED_HERE[name]
    assert theirs(sglang, tokenizer, body) is None
    assert reason in (ours(limits, tokenizer, body) or "")


def test_the_table_is_large():
    assert len(ACCEPTED_BY_BOTH) + len(REFUSED_BY_BOTH) + len(REFUSED_HERE) >= 90


@pytest.fixture(scope="module")
def server(tokenizer):
    config = Qwen3Config.preset("tiny", vocab_size=tokenizer.vocab_size)
    engine = JaxEngine(
        Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)),
        JaxEngineConfig(
            max_batch_size=4, max_seq_len=CONTEXT, steps_per_call=8, min_prefill_len=CONTEXT
        ),
        tokenizer=tokenizer,
    )
    with serve_in_thread(engine, ServerConfig(model_path="tiny"), tokenizer=tokenizer) as s:
        yield s
    engine.close()


async def _send(url, body):
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/generate", json=body) as resp:
            if body.get("stream"):
                events = [line for line in (await resp.text()).split("\n\n") if line]
                return resp.status, events
            return resp.status, await resp.json()


def _items(reply):
    return reply if isinstance(reply, list) else [reply]


def test_every_accepted_body_gets_a_response_sglang_can_decode(sglang, server):
    api_types = sglang[0]

    async def go():
        return await asyncio.gather(*(_send(server.url, b) for b in ACCEPTED_BY_BOTH.values()))

    replies = asyncio.run(go())
    for (name, body), (status, reply) in zip(ACCEPTED_BY_BOTH.items(), replies):
        assert status == 200, (name, reply)
        if body.get("stream"):
            assert reply[-1] == "data: [DONE]", name
            chunks = [json.loads(e.removeprefix("data: ")) for e in reply[:-1]]
            finals = {c.get("index", 0): c for c in chunks if c["meta_info"]["finish_reason"]}
            assert len(finals) == (1 if body["input_ids"] is P else len(body["input_ids"]))
            reply = chunks
        for item in _items(reply):
            decoded = api_types.GenerateResponse.from_json_value(item)
            meta = decoded.meta_info
            assert meta.id and meta.weight_version == "0", name
            if meta.finish_reason is not None:
                assert not isinstance(meta.finish_reason, dict), (name, meta.finish_reason)
            if body.get("return_logprob") is True:
                assert meta.output_token_logprobs is not None, name
                assert len(meta.output_token_logprobs) == meta.completion_tokens, name


def test_response_fields_by_case(server, tokenizer):
    bodies = {
        "n": {"input_ids": P, "sampling_params": {"n": 2, "max_new_tokens": 3}},
        "max_new 0": {"input_ids": P, "sampling_params": {"max_new_tokens": 0}},
        "prompt": {
            "input_ids": [5, 6, 7],
            "return_logprob": True,
            "logprob_start_len": 0,
            "top_logprobs_num": 2,
            "sampling_params": {"max_new_tokens": 3, "temperature": 0},
        },
        "rid prefix": {"input_ids": [P, [7]], "rid": "b", "sampling_params": {"max_new_tokens": 1}},
    }

    async def go():
        return await asyncio.gather(*(_send(server.url, b) for b in bodies.values()))

    (_, n), (_, zero), (_, prompt), (_, prefixed) = asyncio.run(go())
    assert len(n) == 2 and n[0]["meta_info"]["id"] != n[1]["meta_info"]["id"]
    assert zero["output_ids"] == [] and zero["meta_info"]["finish_reason"] == {
        "type": "length",
        "length": 0,
    }
    meta = prompt["meta_info"]
    assert [e[1] for e in meta["input_token_logprobs"]] == [5, 6, 7]
    assert meta["input_token_logprobs"][0][0] is None and meta["input_top_logprobs"][0] is None
    assert len(meta["output_top_logprobs"]) == 3 and all(
        len(row) == 2 for row in meta["output_top_logprobs"]
    )
    assert meta["output_top_logprobs"][0][0][1] == prompt["output_ids"][0]  # greedy: the top one
    assert [r["meta_info"]["id"] for r in prefixed] == ["b_0", "b_1"]
