"""A static HTML page to browse a run's trajectories.

    python -m orchestra_jax.agent.view RUN_DIR [--tokenizer demo] [--out FILE]

Reads, in this order, every `RUN_DIR/trajectories/*.jsonl` (the training loop
writes `RUN_DIR/trajectories/step_000010.jsonl` with `write_jsonl`) and every
`RUN_DIR/trajectories*.jsonl`; RUN_DIR may also be one `.jsonl` file. The
source of an episode is "step <n>" for a `step_<n>.jsonl` file, else the file's
name without extension (`eval_<policy>` from evaluation). Writes one self-contained page (data inline, no network) to
`RUN_DIR/viewer.html` (beside the file when RUN_DIR is a file): a filterable
episode list (source, task, minimum reward) and, per episode, its turns, tool
calls, results, costs, reward, and the whole sequence with trained tokens
(loss mask 1) and masked tokens told apart. With `--tokenizer` the sequence is
the decoded token ids, span by span of equal mask; without, the stored turn
texts stand in for them and the prompt is shown only by its length.
RUN_DIR and the page may be local or `gs://` (`orchestra_jax/io/paths.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from etils import epath

from orchestra_jax.agent.trajectory import Trajectory, read_jsonl
from orchestra_jax.agent.view_page import PAGE_TEMPLATE
from orchestra_jax.io import paths

_STEP = re.compile(r"step_(\d+)")


def trajectory_files(run_dir: epath.Path) -> list[epath.Path]:
    """The JSONL files of a run (see the module docstring for the layout)."""
    if run_dir.is_file():
        return [run_dir]
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is neither a run folder nor a .jsonl file")
    files = sorted((run_dir / "trajectories").glob("*.jsonl")) + sorted(
        run_dir.glob("trajectories*.jsonl")
    )
    files.sort(key=lambda p: (file_step(p) is None, file_step(p) or 0, p.name))  # steps first
    if not files:
        raise FileNotFoundError(
            f"no trajectories in {run_dir}: expected {run_dir}/trajectories/step_*.jsonl "
            f"or {run_dir}/trajectories*.jsonl"
        )
    return files


def file_step(path: os.PathLike) -> int | None:
    """The training step in a `step_<n>.jsonl` name; None for other files (e.g. eval_<policy>)."""
    match = _STEP.search(os.path.basename(os.fspath(path)))
    return int(match.group(1)) if match else None


def mask_spans(traj: Trajectory, tokenizer: Any | None) -> list[dict[str, Any]]:
    """The sequence as [{"trained": bool, "text": str, "tokens": n}] runs of equal mask.

    With a tokenizer: each maximal run of equal loss-mask values decoded on its
    own. Without: prompt placeholder, then per turn its text (trained) and its
    observation (masked), which is what those runs decode to.
    """
    if tokenizer is not None:
        spans, start = [], 0
        for i in range(1, len(traj.token_ids) + 1):
            if i == len(traj.token_ids) or traj.loss_mask[i] != traj.loss_mask[start]:
                ids = traj.token_ids[start:i]
                spans.append(
                    {
                        "trained": bool(traj.loss_mask[start]),
                        "text": tokenizer.decode(ids),
                        "tokens": len(ids),
                    }
                )
                start = i
        return spans
    spans = [
        {
            "trained": False,
            "text": f"[prompt: {traj.prompt_length} tokens; pass --tokenizer to see it]",
            "tokens": traj.prompt_length,
        }
    ]
    for turn in traj.turns:
        spans.append({"trained": True, "text": turn.text, "tokens": turn.num_generated_tokens})
        if turn.observation:
            spans.append(
                {"trained": False, "text": turn.observation, "tokens": turn.num_observation_tokens}
            )
    return spans


def episode_view(
    traj: Trajectory, step: int | None, source: str, tokenizer: Any | None
) -> dict[str, Any]:
    """The JSON the page shows for one episode (token ids themselves are left out)."""
    turns = [
        {
            "text": t.text,
            "tokens": t.num_generated_tokens,
            "finish": t.finish_reason,
            "format_valid": t.format_valid,
            "generation_latency_s": t.generation_latency_s,
            "tool_latency_s": t.tool_latency_s,
            "observation": t.observation,
            "calls": [
                {"name": c.name, "arguments": c.arguments, "error": c.error, "feature": c.feature}
                for c in t.tool_calls
            ],
            "results": [
                {"text": r.text, "cost_usd": r.cost_usd, "latency_s": r.latency_s, "error": r.error}
                for r in t.tool_results
            ],
        }
        for t in traj.turns
    ]
    failure = traj.infra_failure  # not the policy's failure (orchestra_jax/infra_failure.py)
    infra_failure = (
        None if failure is None else f"{failure.kind} at {failure.endpoint}: {failure.message}"
    )
    return {
        "step": step,
        "source": source,
        "task_id": traj.task_id,
        "group_index": traj.group_index,
        "seed": traj.seed,
        "finish_reason": traj.finish_reason,
        "infra_failure": infra_failure,
        "format_valid": traj.format_valid,
        "final_answer": traj.final_answer,
        "correct": traj.correct,
        "reward": traj.reward,
        "advantage": traj.advantage,
        "cost_usd": traj.cost_usd,
        "tool_cost_usd": traj.tool_cost_usd,
        "orchestrator_cost_usd": traj.orchestrator_cost_usd,
        "latency_s": traj.latency_s,
        "num_tokens": len(traj.token_ids),
        "num_trained": sum(traj.loss_mask),
        "tool_call_counts": {k: v for k, v in traj.tool_call_counts.items() if v},
        "preference": traj.preference,
        "metadata": traj.metadata,
        "turns": turns,
        "spans": mask_spans(traj, tokenizer),
    }


def build_page(episodes: Sequence[dict[str, Any]], title: str) -> str:
    """The HTML page with the episodes inline (`</` escaped so no string ends the script)."""
    data = json.dumps(list(episodes), ensure_ascii=False).replace("</", "<\\/")
    safe_title = title.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return PAGE_TEMPLATE.replace("__TITLE__", safe_title).replace("__DATA__", data)


def write_viewer(
    run_dir: str | os.PathLike,
    *,
    tokenizer: Any | None = None,
    out: str | os.PathLike | None = None,
) -> epath.Path:
    """Read the run's trajectories and write the page; returns its path."""
    run_dir = paths.as_path(run_dir)
    episodes = []
    for path in trajectory_files(run_dir):
        step = file_step(path)
        source = path.stem if step is None else f"step {step}"
        episodes.extend(episode_view(t, step, source, tokenizer) for t in read_jsonl(path))
    if out is None:
        out = (run_dir.parent if run_dir.is_file() else run_dir) / "viewer.html"
    out = paths.as_path(out)
    out.write_text(build_page(episodes, f"trajectories of {run_dir}"), encoding="utf-8")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchestra_jax.agent.view", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("run_dir", help="run folder (with trajectories/*.jsonl) or one .jsonl")
    parser.add_argument(
        "--tokenizer",
        default=None,
        help='decode token ids with this tokenizer ("demo" or a folder)',
    )
    parser.add_argument("--out", default=None, help="page to write (default RUN_DIR/viewer.html)")
    args = parser.parse_args(argv)
    tokenizer = None
    if args.tokenizer:
        from orchestra_jax.chat.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(args.tokenizer)
    try:
        out = write_viewer(args.run_dir, tokenizer=tokenizer, out=args.out)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
