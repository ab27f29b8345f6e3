"""chat/tokenizer: the bundled demo tokenizer, and parity of the real Qwen3 one with transformers."""

import importlib.util
import json
import pathlib

import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestra_jax.chat import template
from orchestra_jax.chat.tokenizer import DEMO_TOKENIZER, ChatTokenizer, load_tokenizer

BUILD_SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "build_demo_tokenizer.py"
QWEN3_ADDED = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]
SAMPLES = [
    "",
    "Hello world",
    "  leading spaces\n\n\ttabs",
    "naïve café e\u0301 Straße",
    "中文 日本語 한국어 مرحبا",
    "😀👩‍👩‍👧🚀",
    "1234567890 3.14159 $0.25",
    '{"name": "search", "arguments": {"model": "search-2"}}',
    "<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>\n\n<tool_call>x</tool_call>",
    "<|im_start",
    "\x00\x7f",
]


@pytest.fixture(scope="module")
def demo():
    return load_tokenizer("demo")


def test_demo_has_qwen3_chat_tokens_as_single_ids(demo):
    assert demo.vocab_size <= 4096 and DEMO_TOKENIZER.stat().st_size < 1_000_000
    ids = [demo.token_to_id(token) for token in QWEN3_ADDED]
    assert ids == list(
        range(demo.vocab_size - len(QWEN3_ADDED), demo.vocab_size)
    )  # appended in Qwen3 order
    for token, token_id in zip(QWEN3_ADDED, ids):
        assert demo.encode(token) == [token_id] and demo.decode([token_id]) == token
        assert demo.id_to_token(token_id) == token
    assert (demo.im_start_id, demo.im_end_id) == (
        demo.token_to_id("<|im_start|>"),
        demo.token_to_id("<|im_end|>"),
    )
    assert (demo.eos_id, demo.pad_id) == (demo.im_end_id, demo.token_to_id("<|endoftext|>"))


def test_demo_tokenizes_a_chat_compactly(demo):
    text = template.render(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
    )
    ids = demo.encode(text)
    assert ids[0] == demo.im_start_id and ids.count(demo.im_end_id) == 1
    assert len(ids) < len(text.encode()) / 2  # BPE merges, not bytes
    assert demo.decode(ids) == text


@pytest.mark.parametrize("text", SAMPLES)
def test_demo_round_trips_samples(demo, text):
    assert demo.decode(demo.encode(text)) == text


@settings(max_examples=150, deadline=None)
@given(pieces=st.lists(st.text() | st.sampled_from(QWEN3_ADDED), max_size=6))
def test_demo_round_trips_any_unicode(demo, pieces):
    text = "".join(pieces)
    assert demo.decode(demo.encode(text)) == text


def test_errors_are_clear(demo, tmp_path):
    with pytest.raises(KeyError, match="not a single token"):
        demo.token_to_id("<|nope|>")
    with pytest.raises(KeyError):
        demo.id_to_token(demo.vocab_size)
    with pytest.raises(ValueError, match=">= 0"):
        demo.decode([-1])
    assert (
        demo.decode([demo.vocab_size, demo.im_end_id, 10**6]) == "<|im_end|>"
    )  # padding rows: nothing
    with pytest.raises(TypeError):
        demo.encode(b"bytes")
    with pytest.raises(FileNotFoundError, match="demo"):
        load_tokenizer(tmp_path / "missing")
    bare = tokenizers.Tokenizer(tokenizers.models.BPE())
    with pytest.raises(ValueError, match="lacks the chat tokens"):
        ChatTokenizer(bare, name="bare")


def test_build_script_recipe(tmp_path):
    """The bundled file's recipe, at a small size: deterministic, Qwen3 tokens appended in order."""
    spec = importlib.util.spec_from_file_location("build_demo_tokenizer", BUILD_SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    first = script.build(vocab_size=400, n_docs=300)
    assert first.to_str() == script.build(vocab_size=400, n_docs=300).to_str()
    path = tmp_path / "tokenizer.json"
    first.save(str(path))
    small = load_tokenizer(path)
    assert small.vocab_size == 400 and small.token_to_id("</think>") == 399
    bundled = json.loads(DEMO_TOKENIZER.read_text())
    assert json.loads(first.to_str())["pre_tokenizer"] == bundled["pre_tokenizer"]


@pytest.fixture(scope="module")
def qwen3(qwen3_dir):
    return load_tokenizer(qwen3_dir)


@pytest.fixture(scope="module")
def hf_tokenizer(qwen3_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(qwen3_dir))


def test_qwen3_chat_ids(qwen3):
    assert (qwen3.im_start_id, qwen3.im_end_id, qwen3.eos_id, qwen3.pad_id) == (
        151644,
        151645,
        151645,
        151643,
    )
    assert [qwen3.token_to_id(t) for t in QWEN3_ADDED] == list(range(151643, 151669))
    assert qwen3.vocab_size == 151669


@pytest.mark.parametrize("text", SAMPLES)
def test_qwen3_ids_match_transformers(qwen3, hf_tokenizer, text):
    ids = qwen3.encode(text)
    assert ids == hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert qwen3.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=False)


@settings(max_examples=60, deadline=None)
@given(pieces=st.lists(st.text() | st.sampled_from(QWEN3_ADDED), max_size=5))
def test_qwen3_ids_match_transformers_on_any_text(qwen3, hf_tokenizer, pieces):
    text = "".join(pieces)
    assert qwen3.encode(text) == hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert qwen3.encode_batch([text, "x"]) == [qwen3.encode(text), qwen3.encode("x")]
