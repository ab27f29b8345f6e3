"""Reading the generator's replies (synthesis/outputs.py) and the call cache, without tau2.

Hand-written replies: fenced or bare JSON, wrong shapes, code blocks; a fuzz
over random edits of a valid reply (characters dropped, JSON and fence
fragments inserted, spans repeated): the readers either
return a value matching the schema or raise `Rejected` with a known reason,
never anything else. The call cache's key covers every input of a call.
"""

import asyncio
import random

import jsonschema
import pytest

from orchestra_jax.synthesis import outputs
from orchestra_jax.synthesis.call_cache import CachedGenerator, call_key
from orchestra_jax.synthesis.generator import Call, ScriptedGenerator
from orchestra_jax.synthesis.outputs import REASONS, Rejected

PURPOSES = outputs.PURPOSES_SCHEMA


def test_json_is_read_from_a_fence_or_bare_and_checked():
    fenced = 'Sure.\n```json\n{"purposes": ["a", "b"]}\n```\nDone.'
    assert outputs.extract_json(fenced, PURPOSES) == {"purposes": ["a", "b"]}
    assert outputs.extract_json('x {"purposes": ["a"]} y', PURPOSES) == {"purposes": ["a"]}
    with pytest.raises(Rejected) as e:
        outputs.extract_json('{"purposes": []}', PURPOSES)
    assert e.value.reason == "schema_mismatch" and "purposes" in e.value.detail
    with pytest.raises(Rejected) as e:
        outputs.extract_json('{"purposes": ["a",]}', PURPOSES)
    assert e.value.reason == "invalid_json"
    with pytest.raises(Rejected) as e:
        outputs.extract_json("no json here", PURPOSES)
    assert e.value.reason == "invalid_json"


def test_code_is_the_first_python_block_compiled_not_run():
    text = "```python\nraise SystemExit('never run')\n```\n```python\nx = 1\n```"
    assert outputs.extract_code(text, "tools.py") == "raise SystemExit('never run')\n"
    with pytest.raises(Rejected) as e:
        outputs.extract_code("```python\ndef f(:\n```", "tools.py")
    assert e.value.reason == "code_syntax_error" and "tools.py:1" in e.value.detail
    with pytest.raises(Rejected) as e:
        outputs.extract_code("def f(): pass", "tools.py")
    assert e.value.reason == "no_code_block"


VALID = 'Sure:\n```json\n{"purposes": ["a", "b"]}\n```\n```python\nx = 1\n```'
FRAGMENTS = ["{", "}", "[", "]", '"', ":", ",", "```", "```json\n", "```python\n", "\n", "(", " "]


def mutate(rng, text):
    """`text` with 0-3 random edits: a character dropped, a fragment inserted, or a
    span repeated."""
    for _ in range(rng.randint(0, 3)):
        i = rng.randrange(len(text) + 1)
        edit = rng.randrange(3)
        if edit == 0 and text:
            text = text[: min(i, len(text) - 1)] + text[min(i, len(text) - 1) + 1 :]
        elif edit == 1:
            text = text[:i] + rng.choice(FRAGMENTS) + text[i:]
        else:
            j = rng.randrange(i, len(text) + 1)
            text = text[:j] + text[i:j] + text[j:]
    return text


def test_fuzz_the_readers_accept_or_reject_with_a_reason():
    rng = random.Random(0)
    kept = rejected = 0
    for _ in range(1000):
        text = mutate(rng, VALID)
        try:
            value = outputs.extract_json(text, PURPOSES)
            jsonschema.validate(value, PURPOSES)  # what is returned matches the schema
            kept += 1
        except Rejected as e:
            assert e.reason in REASONS
            rejected += 1
        try:
            compile(outputs.extract_code(text, "f.py"), "f.py", "exec")
        except Rejected as e:
            assert e.reason in ("no_code_block", "code_syntax_error")
    assert kept > 0 and rejected > 0


def test_the_cache_key_covers_every_input_and_a_second_ask_is_free(tmp_path):
    call = Call("tasks", "t-1", ({"role": "user", "content": "hi"},), 100, 1.0)
    keys = {
        call_key("m", call),
        call_key("other", call),
        call_key("m", Call("evolve", "t-1", call.messages, 100, 1.0)),
        call_key("m", Call("tasks", "t-2", call.messages, 100, 1.0)),
        call_key("m", Call("tasks", "t-1", ({"role": "user", "content": "ho"},), 100, 1.0)),
        call_key("m", Call("tasks", "t-1", call.messages, 101, 1.0)),
        call_key("m", Call("tasks", "t-1", call.messages, 100, 0.5)),
    }
    assert len(keys) == 7
    generator = ScriptedGenerator({"t-1": "one two"}, price_in=1e6, price_out=1e6)
    cached = CachedGenerator(generator, tmp_path)
    first = asyncio.run(cached.generate(call))
    again = asyncio.run(CachedGenerator(generator, tmp_path).generate(call))
    assert first == again and generator.calls == ["t-1"]
    assert first.cost_usd == pytest.approx(1 + 2)  # 1 prompt word, 2 reply words at $1M/M
    assert cached.ledger.stages["tasks"].paid_calls == 1
    assert not list(tmp_path.glob(".tmp-*"))  # written whole, then renamed
