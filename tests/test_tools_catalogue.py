"""The model catalogue, `tools.backends` parsing and the search fallback."""

import numpy as np
import pytest
import yaml

from experiments.configs import grpo_hle
from orchestra_jax.tasks import Task
from orchestra_jax.tools import live_backends
from orchestra_jax.tools.config import aliases_from_profiles
from orchestra_jax.tools.config_sampler import (
    SamplerRanges,
    ToolConfigSampler,
    fixed_eval_configs,
)
from orchestra_jax.tools.experts.catalogue import (
    CatalogueError,
    check_roles_cover,
    load_catalogue,
    missing_api_keys,
)
from orchestra_jax.tools.retrieval.retrievers import Document, FallbackRetriever

PAPER_TOOLS = ("search", "enhance_reasoning", "answer")

# The reference release's alias -> model map and prices (USD per million tokens in /
# out), gpt-5's and gpt-5-mini's input prices as published (not divided by 1e7).
REFERENCE = {
    "search-1": ("gpt-5", 1.25, 10.0),
    "search-2": ("gpt-5-mini", 0.25, 2.0),
    "search-3": ("Qwen3-32B", 0.8, 0.8),
    "reasoner-1": ("gpt-5", 1.25, 10.0),
    "reasoner-2": ("gpt-5-mini", 0.25, 2.0),
    "reasoner-3": ("Qwen2.5-Coder-32B-Instruct", 0.8, 0.8),
    "answer-1": ("gpt-5", 1.25, 10.0),
    "answer-2": ("gpt-5-mini", 0.25, 2.0),
    "answer-3": ("Llama-3.3-70B-Instruct", 0.9, 0.9),
    "answer-4": ("Qwen3-32B", 0.8, 0.8),
    "answer-math-1": ("Qwen2.5-Math-72B-Instruct", 0.9, 0.9),
    "answer-math-2": ("Qwen2.5-Math-7B-Instruct", 0.2, 0.2),
}


def paper():
    return load_catalogue(grpo_hle.PAPER_CATALOGUE)


def test_the_shipped_catalogue_is_the_papers_line_up_at_the_reference_prices():
    profiles = paper().profiles(PAPER_TOOLS)
    aliases = aliases_from_profiles(profiles, [1.0] * len(profiles), [1.0] * len(profiles))
    got = {a.alias: (a.backend, a.price_in, a.price_out) for a in aliases}
    assert got == REFERENCE
    tools = {a.alias: a.tool for a in aliases}
    assert tools["answer-math-2"] == "answer" and tools["reasoner-3"] == "enhance_reasoning"
    # The latencies the reference's descriptions state for gpt-5, per role.
    latency = {a.alias: a.latency_s for a in aliases}
    assert (latency["search-1"], latency["reasoner-1"], latency["answer-1"]) == (22, 31, 96)
    assert paper().model("gpt-5").api_key_env == "OPENAI_API_KEY"
    # OpenAI's reasoning models take max_completion_tokens and their own temperature.
    assert {m.name for m in paper().models if m.reasoning_model} == {"gpt-5", "gpt-5-mini"}
    assert paper().model("Qwen3-32B").api_key_env is None


def test_the_sampler_randomises_the_catalogue_as_it_does_simulated_profiles():
    profiles = paper().profiles(PAPER_TOOLS)
    ranges = SamplerRanges(keep_probability=0.5)
    sampler = ToolConfigSampler(profiles, ranges=ranges, seed=3)
    configs = [sampler.sample(Task(f"t{i}", "q", "a")) for i in range(64)]
    base = {(p.backend, p.tool): p for p in profiles}
    offered = set()
    for config in configs:
        for tool in PAPER_TOOLS:
            assert config.aliases_for(tool), "every meta-tool keeps at least one model"
        for a in config.aliases:
            p = base[(a.backend, a.tool)]
            offered.add(a.alias)
            scale = a.price_out / p.price_out
            assert 0.5 * 0.99 <= scale <= 2.0 * 1.01
            assert 0.5 * 0.99 <= a.latency_s / p.latency_s <= 2.0 * 1.01
    # Shuffled aliases: the same name maps to different models across tasks.
    backends_of_search_1 = {c.alias("search-1").backend for c in configs}
    assert len(backends_of_search_1) == 3
    assert {"answer-math-1", "answer-4"} <= offered
    held_out = fixed_eval_configs(profiles, ranges=ranges)
    spread = held_out["heldout_spread"]
    assert spread.alias("answer-1").price_out == pytest.approx(10.0 * 4)  # priciest x high x 2
    assert spread.alias("answer-2").price_out == pytest.approx(2.0 / 4)


def write(tmp_path, models, name="c.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"models": models}))
    return path


def entry(**overrides):
    model = {
        "name": "m",
        "model": "m",
        "base_url": "http://127.0.0.1:9/v1",
        "api_key_env": None,
        "price_in": 1.0,
        "price_out": 2.0,
        "latency_s": 3.0,
        "roles": ["answer"],
    }
    model.update(overrides)
    return {k: v for k, v in model.items() if v != "DROP"}


@pytest.mark.parametrize(
    "model, message",
    [
        (entry(price_in="DROP"), "missing field(s) ['price_in']"),
        (entry(roles=["answer", "poet"]), "unknown role 'poet'"),
        (entry(price_out=-1), "price_out must be >= 0, got -1"),
        (entry(latency_s="fast"), "latency_s must be a number"),
        (entry(base_url="127.0.0.1:9"), "base_url must start with http"),
        (entry(colour="red"), "unknown field(s) ['colour']"),
        (entry(roles={"search": {"price": 1}}), "role 'search' takes only"),
        (entry(family="llama"), "family must be one of ['qwen', 'math', 'gpt', 'other']"),
    ],
)
def test_catalogue_mistakes_are_one_line_naming_file_model_and_field(tmp_path, model, message):
    path = write(tmp_path, [model])
    with pytest.raises(CatalogueError) as e:
        load_catalogue(path)
    text = str(e.value)
    assert message in text and str(path) in text and "'m'" in text and "\n" not in text


def test_catalogue_file_level_mistakes(tmp_path):
    with pytest.raises(CatalogueError, match="cannot read it"):
        load_catalogue(tmp_path / "none.yaml")
    with pytest.raises(CatalogueError, match="duplicate model name"):
        load_catalogue(write(tmp_path, [entry(), entry()]))
    (tmp_path / "bad.yaml").write_text("models: [a\n")
    with pytest.raises(CatalogueError, match="not valid"):
        load_catalogue(tmp_path / "bad.yaml")
    only_answer = load_catalogue(write(tmp_path, [entry()]))
    assert check_roles_cover(only_answer, ["search", "answer"]) == [
        f"catalogue {tmp_path / 'c.yaml'}: no model serves meta-tool 'search'"
    ]


def test_unset_api_keys_are_named(tmp_path, monkeypatch):
    monkeypatch.delenv("ORCHESTRA_TEST_KEY", raising=False)
    catalogue = load_catalogue(write(tmp_path, [entry(api_key_env="ORCHESTRA_TEST_KEY")]))
    assert missing_api_keys(catalogue.models) == [
        "model 'm' reads its API key from $ORCHESTRA_TEST_KEY, which is not set"
    ]
    monkeypatch.setenv("ORCHESTRA_TEST_KEY", "k")
    assert missing_api_keys(catalogue.models) == []


def test_backends_spec_has_a_default_and_per_tool_overrides():
    parse = live_backends.parse_backends
    assert parse("live", PAPER_TOOLS) == dict.fromkeys(PAPER_TOOLS, "live")
    assert parse("live, answer=offline", [*PAPER_TOOLS, "python"]) == {
        "search": "live",
        "enhance_reasoning": "live",
        "answer": "offline",
    }
    for spec, message in (
        ("cloud", "kind 'cloud'"),
        ("answer=live", "no default"),
        ("live,python=offline", "'python' is not an enabled meta-tool"),
        ("live,offline", "two defaults"),
    ):
        with pytest.raises(ValueError, match=message):
            parse(spec, [*PAPER_TOOLS, "python"])


class Fixed:
    def __init__(self, docs, fail=False):
        self.docs, self.fail, self.calls = docs, fail, []

    def search(self, query, k, allowed_ids=None):
        self.calls.append((query, k, allowed_ids))
        if self.fail:
            raise RuntimeError("web search down")
        docs = [d for d in self.docs if allowed_ids is None or d.id in allowed_ids]
        return docs[:k]


def test_fallback_tops_up_from_the_web_when_the_whitelist_leaves_too_few():
    local = Fixed([Document(str(i), f"text {i}") for i in range(5)])
    web = Fixed([Document("1", "dup"), Document("w1", "web 1"), Document("w2", "web 2")])
    retriever = FallbackRetriever(local, web, min_docs=3)
    assert [d.id for d in retriever.search("q", 4)] == ["0", "1", "2", "3"] and not web.calls
    assert [d.id for d in retriever.search("q", 4, {"1"})] == ["1", "w1", "w2"]
    assert web.calls == [("q", 3, None)]
    down = FallbackRetriever(local, Fixed([], fail=True), min_docs=3)
    assert [d.id for d in down.search("q", 4, {"1"})] == ["1"]  # what the index had
    with pytest.raises(RuntimeError, match="down"):
        down.search("q", 4, set())


def test_paper_profiles_in_the_local_catalogue_are_all_local():
    local = load_catalogue(grpo_hle.LOCAL_CATALOGUE)
    assert {m.base_url for m in local.models} == {"http://127.0.0.1:30100/v1"}
    assert not missing_api_keys(local.models)
    prices = sorted(m.price_out for m in local.models)
    assert len(set(prices)) == len(prices)  # the cheapest and the strongest differ
    assert np.all([m.extra_body for m in local.models])
