"""Expert protocols' pure parts: reply extraction, the sub-agents' prompts and budgets,
the catalogue's `family` and the start-up checks of `tools.experts`."""

import pytest
import yaml

from experiments.configs import grpo_hle
from orchestra_jax.envs.config import EnvConfig
from orchestra_jax.tasks import Task
from orchestra_jax.tools import live_backends
from orchestra_jax.tools.base import ToolContext
from orchestra_jax.tools.experts import prompts
from orchestra_jax.tools.experts import protocols as ep
from orchestra_jax.tools.experts.catalogue import CatalogueError, load_catalogue, parse_model
from orchestra_jax.tools.sandbox.registry import SandboxResult
from orchestra_jax.tools.tools_config import ToolsConfig

QUESTION = "Which river carved the valley?"
REFERENCE = ep.EXPERT_PROTOCOLS.get("reference")
PROJECT = ep.EXPERT_PROTOCOLS.get("project")


def ctx(documents=(), notes=(), said="I should look up the river."):
    return ToolContext(
        task=Task("t1", QUESTION, "gold"),
        messages=[
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": said},
        ],
        documents=list(documents),
        notes=list(notes),
    )


def test_query_is_inside_query_tags_or_the_question_and_is_cut_to_390_characters():
    assert ep.extract_tagged_query("Let me see. <query>glacier valleys</query>", QUESTION) == (
        "glacier valleys"
    )
    assert ep.extract_tagged_query("<query>a</query><query>river age</query>", QUESTION) == (
        "river age"
    )
    assert ep.extract_tagged_query("<query>abcd</query>", QUESTION) == QUESTION  # 4 < 5
    assert ep.extract_tagged_query("<query>abcde</query>", QUESTION) == "abcde"
    assert ep.extract_tagged_query("", QUESTION) == QUESTION
    assert ep.extract_tagged_query("no tags at all", QUESTION) == "no tags at all"
    long = "w" * 500
    assert ep.extract_tagged_query(f"<query>{long}</query>", QUESTION) == "w" * 390
    assert ep.extract_tagged_query("<query>x</query>", "q" * 400) == "q" * 390


def test_code_is_the_text_after_the_last_python_fence():
    text = "First:\n```python\nprint(1)\n```\nThen:\n```python\nprint(6 * 7)\n```\nDone."
    assert ep.extract_python_after_fence(text) == "\nprint(6 * 7)\n"
    assert ep.extract_python_after_fence("print(2)") == "print(2)"


def test_boxed_answer_runs_to_the_last_brace_and_is_empty_without_a_box():
    assert ep.extract_boxed("So \\boxed{42}.") == "42"
    assert ep.extract_boxed("\\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert ep.extract_boxed("Final answer: 42") == ""
    assert ep.extract_boxed("\\boxed{") == ""


def test_answer_tag_is_inside_the_last_answer_tag_or_the_whole_text():
    assert ep.extract_answer_tag("<think>hm</think>\n<answer> Rhine </answer>") == "Rhine"
    assert ep.extract_answer_tag("Rhine") == "Rhine"
    assert ep.extract_answer_tag("<answer></answer>") == ""


def test_the_answer_is_read_by_family():
    text = "<answer>Rhine</answer> \\boxed{Rhône}"
    assert REFERENCE.answer(text, "qwen") == "Rhône"
    assert REFERENCE.answer(text, "math") == "Rhône"
    assert REFERENCE.answer(text, "gpt") == "Rhine"
    assert REFERENCE.answer(text, "other") == "Rhine"
    assert PROJECT.answer("thinking\nFinal answer: Rhine", "qwen") == "Rhine"


def test_reference_prompts_by_role_and_family_are_one_user_message():
    docs = ["The Rhine carved it.", "Glaciers shaped valleys."]
    messages, temperature = REFERENCE.request("query", "qwen", ctx(docs), 0.0)
    assert temperature == 0.2
    assert messages == [
        {
            "role": "user",
            "content": "Documents:\nDoc 1: The Rhine carved it.\n\nDoc 2: Glaciers shaped "
            "valleys.\n\nQuestion: Which river carved the valley?\nDo not answer the "
            "question. Write one search query for a relevant piece of information that is "
            "still missing: a few keywords or a short sentence. Put the query between "
            "<query> and </query>.",
        }
    ]
    messages, temperature = REFERENCE.request("code", "gpt", ctx(), 0.0)
    assert temperature == 1.0
    assert messages[0]["content"] == (
        "\n\nQuestion: Which river carved the valley?\nDo not answer the question. Write "
        "Python code whose execution prints intermediate results that help answer it. Put "
        "the code between ```python and ```. The code must run on its own, with every "
        "import and definition it needs."
    )
    messages, _ = REFERENCE.request("answer", "math", ctx(), 0.0)
    assert messages[0]["content"] == (
        "\n\nWhich river carved the valley?\nReason step by step, then give the final "
        "answer inside \\boxed{}."
    )
    messages, temperature = REFERENCE.request("answer", "other", ctx(), 0.0)
    assert temperature == 0.2
    assert messages[0]["content"] == (
        "\n\nWhich river carved the valley?\nPut your reasoning between <think> and "
        "</think>, then only the exact answer, with no explanation, between <answer> and "
        "</answer>."
    )


def test_reference_experts_never_read_the_orchestrators_words():
    said = "ORCHESTRATOR-CANARY thinks it is the Rhine"
    for role in ("query", "code", "answer"):
        for family in ep.MODEL_FAMILIES:
            messages, _ = REFERENCE.request(role, family, ctx(said=said), 0.0)
            assert "ORCHESTRATOR-CANARY" not in str(messages)
    messages, temperature = PROJECT.request("answer", "gpt", ctx(said=said), 0.3)
    assert "ORCHESTRATOR-CANARY" in messages[-1]["content"] and temperature == 0.3


def test_project_protocol_is_the_role_prompt_with_the_orchestrators_last_2000_characters():
    said = "a" * 1500 + "b" * 1500
    messages, _ = PROJECT.request("query", "", ctx(["doc"], ["note"], said=said), 0.0)
    assert messages == prompts.role_messages("query", QUESTION, ["doc"], ["note"], said[-2000:])


def test_each_family_reads_documents_and_code_outputs_within_its_budget():
    doc = "d" * 5000
    note = "```python\nprint(1)\n```\n\n```output\n1\n```\n\n"
    assert ep.reference_context([doc], [note], ep.REFERENCE_BUDGETS[("code", "qwen")]) == (
        "Documents:\nDoc 1: " + "d" * 200 + "\n\n" + note
    )
    assert ep.reference_context([doc], [], ep.REFERENCE_BUDGETS[("answer", "math")]) == (
        "Documents:\nDoc 1: " + "d" * 500 + "\n\n"
    )
    assert ep.reference_context([doc], [], ep.REFERENCE_BUDGETS[("answer", "qwen")]) == (
        "Documents:\nDoc 1: " + "d" * 4000 + "\n\n"
    )
    assert ep.reference_context([doc], [], ep.REFERENCE_BUDGETS[("answer", "gpt")]) == (
        "Documents:\nDoc 1: " + doc + "\n\n"
    )
    # Over budget the last tokens stay (CHARS_PER_TOKEN characters each); code outputs
    # cut mid-way reopen a fence.
    small = ep.Budget(doc_chars=None, code_tokens=3, context_tokens=5)
    assert ep.reference_context([], ["0123456789abcdefghij"], small) == "```\n89abcdefghij"
    assert ep.reference_context(["x" * 30], [], small) == "Documents:\n" + "x" * 18 + "\n\n"
    assert ep.reference_context([], [], small) == ""


def test_a_run_is_noted_as_code_and_stdout_only_when_it_printed():
    ok = SandboxResult("42\n", "warning\n", 0, False, False, duration_s=0.1)
    assert REFERENCE.note("print(42)", ok) == (
        "```python\nprint(42)\n```\n\n```output\n42\n\n```\n\n"
    )
    assert REFERENCE.note("pass", SandboxResult(" \n", "", 0, False, False, 0.1)) is None
    assert REFERENCE.note("x", SandboxResult("1\n", "", None, True, False, 60.0)) is None
    assert PROJECT.note("print(42)", ok) == "42\nstderr:\nwarning"
    assert REFERENCE.code_timeout_s(10.0) == 60.0 and PROJECT.code_timeout_s(10.0) == 10.0
    assert REFERENCE.empty_answer_ends and not PROJECT.empty_answer_ends


def test_the_registry_takes_import_paths():
    assert ep.EXPERT_PROTOCOLS.get("orchestra_jax.tools.experts.protocols:PROJECT") is PROJECT
    assert "reference" in ep.EXPERT_PROTOCOLS.problem("nonesuch")
    assert isinstance(REFERENCE, ep.ExpertProtocol) and isinstance(PROJECT, ep.ExpertProtocol)


def test_catalogue_family_is_validated_and_the_paper_catalogue_states_each():
    raw = {
        "name": "m",
        "model": "m",
        "base_url": "http://127.0.0.1:1/v1",
        "price_in": 1,
        "price_out": 1,
        "latency_s": 1,
        "roles": ["answer"],
    }
    assert parse_model(raw, "c").family == ""
    assert parse_model({**raw, "family": "math"}, "c").family == "math"
    with pytest.raises(CatalogueError, match="family must be one of"):
        parse_model({**raw, "family": "llama"}, "c")
    families = {m.name: m.family for m in load_catalogue(grpo_hle.PAPER_CATALOGUE).models}
    assert families == {
        "gpt-5": "gpt",
        "gpt-5-mini": "gpt",
        "Qwen2.5-Coder-32B-Instruct": "qwen",
        "Llama-3.3-70B-Instruct": "other",
        "Qwen3-32B": "qwen",
        "Qwen2.5-Math-72B-Instruct": "math",
        "Qwen2.5-Math-7B-Instruct": "math",
    }


def live_config(tmp_path, **tools):
    config = grpo_hle.get_config("live_tiny")
    config.tools.search_index = str(tmp_path)
    (tmp_path / "manifest.json").write_text("{}")
    for key, value in tools.items():
        config.tools[key] = value
    return config


def test_start_up_checks_of_tools_experts(tmp_path):
    assert backend_config_problems(live_config(tmp_path, experts="reference"), ["frames"]) == []
    own = live_config(tmp_path, experts="orchestra_jax.tools.experts.protocols:PROJECT")
    assert backend_config_problems(own, ["frames"]) == []
    [unknown] = backend_config_problems(live_config(tmp_path, experts="nonesuch"), ["frames"])
    assert unknown.startswith("tools.experts: unknown expert protocol 'nonesuch'")
    catalogue = yaml.safe_load(open(grpo_hle.LOCAL_CATALOGUE))
    del catalogue["models"][1]["family"]
    (tmp_path / "models.yaml").write_text(yaml.safe_dump(catalogue))
    config = live_config(tmp_path, experts="reference", catalogue=str(tmp_path / "models.yaml"))
    assert backend_config_problems(config, ["frames"]) == [
        "tools.catalogue: model 'tiny-medium' states no family (one of ['qwen', 'math', "
        "'gpt', 'other']), which tools.experts='reference' needs"
    ]
    config.tools.experts = "project"  # the project's experts need no family
    assert backend_config_problems(config, ["frames"]) == []
    offline = live_config(tmp_path, experts="reference", backends="live,answer=offline")
    assert any("simulated experts of ['answer'] have none" in e for e in offline_errors(offline))
    synthetic = grpo_hle.get_config("micro")
    synthetic.tools.experts = "reference"
    assert any("only env.name='qa' reads it" in e for e in backend_config_problems(synthetic, []))


def offline_errors(config):
    return backend_config_problems(config, [])


def backend_config_problems(config, file_sources):
    """`live_backends.backend_config_problems` on a whole config's sections."""
    return live_backends.backend_config_problems(
        ToolsConfig.unchecked(config.tools),
        EnvConfig.unchecked(config.env).played(),
        file_sources,
    )
