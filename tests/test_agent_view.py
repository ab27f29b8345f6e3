"""The trajectory viewer: finds a run's files, writes one self-contained page."""

import json
import re

import pytest

from orchestra_jax.agent import view
from orchestra_jax.agent.trajectory import (
    ToolCallRecord,
    ToolResultRecord,
    Trajectory,
    Turn,
    write_jsonl,
)
from orchestra_jax.chat.tokenizer import load_tokenizer

TOK = load_tokenizer("demo")
PROMPT = "<|im_start|>user\nWhat is 6*7?<|im_end|>\n<|im_start|>assistant\n"
TURN = '<tool_call>\n{"name": "answer", "arguments": {"q": "42"}}\n</tool_call><|im_end|>'


def trajectory(task_id, reward, group_index=0):
    prompt, gen = TOK.encode(PROMPT), TOK.encode(TURN)
    return Trajectory(
        task_id=task_id,
        group_index=group_index,
        seed=1,
        token_ids=prompt + gen,
        loss_mask=[0] * len(prompt) + [1] * len(gen),
        rollout_logprobs=[0.0] * len(prompt) + [-0.5] * len(gen),
        prompt_length=len(prompt),
        turns=[
            Turn(
                text=TURN,
                num_generated_tokens=len(gen),
                finish_reason="stop",
                tool_calls=[ToolCallRecord("answer", {"q": "42"}, feature="tool:answer")],
                tool_results=[ToolResultRecord("42 </script><b>x</b>", 0.001, 2.0)],
            )
        ],
        final_answer="42",
        finish_reason="answer",
        tool_call_counts={"tool:answer": 1},
        cost_usd=0.001,
        tool_cost_usd=0.001,
        latency_s=2.0,
        correct=True,
        reward=reward,
    )


def page_data(html):
    match = re.search(r"const EPISODES = (.*);\nconst \$", html)
    return json.loads(match.group(1).replace("<\\/", "</"))


@pytest.fixture
def run_dir(tmp_path):
    write_jsonl(tmp_path / "trajectories" / "step_000010.jsonl", [trajectory("a", 1.0)])
    write_jsonl(
        tmp_path / "trajectories" / "step_000020.jsonl",
        [trajectory("b", 0.0), trajectory("b", 0.5, 1)],
    )
    write_jsonl(tmp_path / "trajectories" / "eval_random.jsonl", [trajectory("c", None)])
    return tmp_path


def test_page_lists_every_episode_with_its_step(run_dir):
    out = view.write_viewer(run_dir)
    assert out == run_dir / "viewer.html"
    html = out.read_text(encoding="utf-8")
    episodes = page_data(html)
    assert [(e["step"], e["source"], e["task_id"], e["reward"]) for e in episodes] == [
        (10, "step 10", "a", 1.0),
        (20, "step 20", "b", 0.0),
        (20, "step 20", "b", 0.5),
        (None, "eval_random", "c", None),
    ]
    assert "</script><b>" not in html.split("const EPISODES")[1].split("\n")[0]  # escaped
    assert "http" not in html  # self-contained
    spans = episodes[0]["spans"]
    assert [s["trained"] for s in spans] == [False, True] and spans[1]["text"] == TURN


def test_tokenizer_decodes_the_masked_and_trained_runs(run_dir):
    episodes = page_data(view.write_viewer(run_dir, tokenizer=TOK).read_text(encoding="utf-8"))
    assert [(s["trained"], s["text"]) for s in episodes[0]["spans"]] == [
        (False, PROMPT),
        (True, TURN),
    ]


def test_cli(run_dir, capsys):
    assert view.main([str(run_dir), "--tokenizer", "demo", "--out", str(run_dir / "v.html")]) == 0
    assert (run_dir / "v.html").exists()
    assert view.main([str(run_dir / "missing")]) == 1
    assert "neither a run folder" in capsys.readouterr().err


def test_single_file_and_empty_folder(tmp_path):
    path = tmp_path / "trajectories_eval.jsonl"
    write_jsonl(path, [trajectory("a", None)])
    assert view.write_viewer(path) == tmp_path / "viewer.html"
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no trajectories .*step_"):
        view.trajectory_files(tmp_path / "empty")
