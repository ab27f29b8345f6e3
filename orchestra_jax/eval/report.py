"""Every policy evaluated in a folder, side by side: a markdown table and a Pareto plot.

`write_report(folder)` reads each `eval_<policy>.json` there and writes
`eval_report.md` (the evaluation protocol, a warning where policies ran under
different ones; accuracy, cost, latency, preference score, held-out reward,
tool mix; accuracy, cost and tool mix per task domain and per benchmark
category; the rows each data source read, skipped and held out; how many
episodes failed by infrastructure, by kind and endpoint (left out of every
score); pass^k per domain where policies played several trials per task, each
task over the trials it kept) and `eval_pareto.png`
(accuracy against mean cost, one point per policy, the non-dominated ones
joined). A policy is dominated when another is at least as accurate and at
most as expensive, and strictly better in one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from orchestra_jax.io import paths


def load_summaries(folder: str) -> list[dict[str, Any]]:
    """Every `eval_*.json` in `folder` (local or `gs://`), in name order."""
    files = sorted(paths.as_path(folder).glob("eval_*.json"), key=lambda p: p.name)
    return [json.loads(p.read_text()) for p in files]


def dominates(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """a is at least as accurate and at most as costly as b, and better in one."""
    no_worse = a["accuracy"] >= b["accuracy"] and a["mean_cost_usd"] <= b["mean_cost_usd"]
    better = a["accuracy"] > b["accuracy"] or a["mean_cost_usd"] < b["mean_cost_usd"]
    return no_worse and better


def dominated_by(policy: dict[str, Any], others: Sequence[dict[str, Any]]) -> list[str]:
    return [o["policy"] for o in others if o["policy"] != policy["policy"] and dominates(o, policy)]


def _fmt(value, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def protocol_line(summaries: Sequence[dict[str, Any]]) -> str:
    """Which evaluation protocol (`eval.protocol`) the summaries ran under, and a
    warning where they differ (their figures are then not comparable)."""
    by_protocol: dict[str, list[str]] = {}
    for s in summaries:
        by_protocol.setdefault(s.get("protocol", "heldout"), []).append(s["policy"])
    if len(by_protocol) == 1:
        return f"Evaluation protocol: {next(iter(by_protocol))} (docs/reproduction.md).\n\n"
    parts = "; ".join(f"{p}: {', '.join(names)}" for p, names in sorted(by_protocol.items()))
    return f"Evaluation protocols differ ({parts}): these figures are not comparable.\n\n"


def markdown_table(summaries: Sequence[dict[str, Any]]) -> str:
    head = protocol_line(summaries) + (
        "| policy | accuracy | mean cost (USD) | mean latency (s) | preference score "
        "| held-out reward | calls / episode | dominated by |\n"
        "|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for s in sorted(summaries, key=lambda s: -s["accuracy"]):
        rows.append(
            f"| {s['policy']} | {s['accuracy']:.3f} ± {s.get('accuracy_stderr', 0):.3f} "
            f"| {s['mean_cost_usd']:.5f} | {s['mean_latency_s']:.1f} "
            f"| {_fmt(s.get('preference_score'), '.3f')} "
            f"| {_fmt(s.get('heldout_reward'), '.3f')} | {s.get('mean_tool_calls', 0):.2f} "
            f"| {', '.join(dominated_by(s, summaries)) or '—'} |"
        )
    mix = ["", "Tool-call mix (share of calls by tool/backend):", ""]
    for s in summaries:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in s.get("backend_mix", {}).items())
        mix.append(f"- {s['policy']}: {parts or 'no calls'}")
    return (
        head
        + "\n".join(rows)
        + "\n"
        + "\n".join(mix)
        + "\n"
        + _group_table(summaries, "by_domain", "domain", min_groups=2)
        + _group_table(summaries, "by_category", "category", min_groups=1)
        + _data_table(summaries)
        + _infra_lines(summaries)
        + _pass_k_table(summaries)
    )


def _infra_lines(summaries: Sequence[dict[str, Any]]) -> str:
    """Per policy: the episodes that failed by infrastructure (left out of every
    score above), by kind and by endpoint."""
    lines = [
        "",
        "Episodes failed by infrastructure (an engine, expert, search, judge, user "
        "simulator or evaluator that failed for good; left out of every score):",
        "",
    ]
    for s in summaries:
        failed = int(s.get("infra_failed", 0))
        played = int(s.get("num_episodes", 0)) + failed
        line = f"- {s['policy']}: {failed} of {played} episodes"
        if failed:
            kinds = ", ".join(f"{k} {n}" for k, n in s.get("infra_failed_by_kind", {}).items())
            ends = ", ".join(f"{e} {n}" for e, n in s.get("infra_failed_by_endpoint", {}).items())
            line += f" (by kind: {kinds}; by endpoint: {ends})"
        lines.append(line)
    return "\n".join(lines) + "\n"


def _pass_k_table(summaries: Sequence[dict[str, Any]]) -> str:
    """pass^1 .. pass^k per domain and policy, with mean cost and latency per episode
    (policies evaluated over several trials per task, e.g. τ²)."""
    if not any(s.get("trials", 1) > 1 for s in summaries):
        return ""
    lines = [
        "",
        "pass^k over trials per task (mean cost in USD and latency in s per episode; "
        "the simulated user's spending is apart and not included). Each task counts "
        "over the trials it kept: a task with n trials counts towards pass^k for k <= n, "
        "so where a task lost an episode to infrastructure, pass^k for its highest k "
        "is over fewer tasks, as the cell says:",
        "",
        "| policy | domain | pass^k (k = 1, 2, ...) | mean cost | mean latency |",
        "|---|---|---|---|---|",
    ]
    for s in summaries:
        domains = s.get("by_domain", {})
        for domain, values in s.get("pass_k", {}).items():
            row = s if domain == "all" else domains.get(domain, {})
            counts = s.get("pass_k_tasks", {}).get(domain, {})
            tasks = max(counts.values(), default=0)
            passes = ", ".join(
                f"{v:.3f}"
                + (f" ({counts[k]} of {tasks} tasks)" if counts.get(k, tasks) < tasks else "")
                for k, v in values.items()
            )
            lines.append(
                f"| {s['policy']} | {domain} | {passes} "
                f"| {_fmt(row.get('mean_cost_usd'), '.5f')} "
                f"| {_fmt(row.get('mean_latency_s'), '.1f')} |"
            )
    return "\n".join(lines) + "\n"


def _group_table(
    summaries: Sequence[dict[str, Any]], field: str, what: str, *, min_groups: int
) -> str:
    """Per group (a summary's `field`: domain or category) and policy: accuracy, cost,
    and each tool's most used backend; empty with fewer than `min_groups` groups."""
    groups = sorted({d for s in summaries for d in s.get(field, {})})
    if len(groups) < min_groups:
        return ""
    lines = [
        "",
        f"Per {what} (accuracy, mean cost in USD; per tool, its most used backend "
        "and that backend's share of the tool's calls):",
        "",
        "| policy | " + " | ".join(groups) + " |",
        "|---|" + "---|" * len(groups),
    ]
    for s in summaries:
        cells = []
        for d in groups:
            row = s.get(field, {}).get(d)
            cells.append(
                "—"
                if row is None
                else f"{row['accuracy']:.2f}, {row['mean_cost_usd']:.4f}; "
                + _top_backend_per_tool(row["backend_mix"])
            )
        lines.append(f"| {s['policy']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _data_table(summaries: Sequence[dict[str, Any]]) -> str:
    """What each data source of the evaluation read (the first summary that says)."""
    reports = next((s["data"] for s in summaries if s.get("data")), [])
    if not reports:
        return ""
    lines = [
        "",
        "Data (rows read; skipped on purpose, e.g. image questions; malformed; held-out tasks):",
        "",
        "| source | file | rows | skipped | malformed | held-out tasks |",
        "|---|---|---|---|---|---|",
    ]
    for r in reports:
        lines.append(
            f"| {r.get('source')} | {r.get('source_file', '')} | {r.get('rows', 0)} "
            f"| {r.get('skipped', 0)} | {r.get('malformed', 0)} | {r.get('split_tasks', 0)} |"
        )
    return "\n".join(lines) + "\n"


def _top_backend_per_tool(mix: dict[str, float]) -> str:
    """Per tool, its most used backend and that backend's share of the tool's calls
    ("answer/sim-small 0.75, search/sim-small 1.00"). A tool whose shares are all 0
    (listed, never called) is left out."""
    by_tool: dict[str, dict[str, float]] = {}
    for key, share in mix.items():
        tool, _, backend = key.partition("/")
        by_tool.setdefault(tool, {})[backend or tool] = share
    parts = []
    for tool, backends in sorted(by_tool.items()):
        total = sum(backends.values())
        if total <= 0:
            continue
        top = max(backends, key=lambda b: backends[b])
        parts.append(f"{tool}/{top} {backends[top] / total:.2f}")
    return ", ".join(parts) or "no calls"


def pareto_plot(summaries: Sequence[dict[str, Any]], out_png: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    frontier = sorted(
        (s for s in summaries if not dominated_by(s, summaries)), key=lambda s: s["mean_cost_usd"]
    )
    ax.plot(
        [s["mean_cost_usd"] for s in frontier],
        [s["accuracy"] for s in frontier],
        "--",
        color="0.6",
        zorder=1,
        label="Pareto frontier",
    )
    for s in summaries:
        trained = not s.get("baseline", False)
        ax.errorbar(
            s["mean_cost_usd"],
            s["accuracy"],
            yerr=s.get("accuracy_stderr", 0),
            fmt="*" if trained else "o",
            markersize=12 if trained else 7,
            color="C3" if trained else "C0",
            zorder=2,
        )
        ax.annotate(
            s["policy"],
            (s["mean_cost_usd"], s["accuracy"]),
            textcoords="offset points",
            xytext=(6, 4),
            fontsize=8,
        )
    ax.set_xscale("log")
    ax.set_xlabel("mean cost per task (USD, log scale)")
    ax.set_ylabel("accuracy")
    ax.set_title("Held-out accuracy against cost")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    with paths.as_path(out_png).open("wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)
    return out_png


def write_report(folder: str) -> tuple[str, str]:
    """Writes eval_report.md and eval_pareto.png for every eval_*.json in `folder`."""
    summaries = load_summaries(folder)
    if not summaries:
        raise FileNotFoundError(f"no eval_*.json in {folder}")
    md = paths.join(folder, "eval_report.md")
    paths.write_text_atomic(md, markdown_table(summaries))
    return md, pareto_plot(summaries, paths.join(folder, "eval_pareto.png"))
