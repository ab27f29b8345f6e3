"""The synthesis pipeline on its scripted generator: yield, cost and validation time.

Runs `experiments/configs/synthesize.py:demo` (ToolScale's school domain: tasks
and evolved variants from recorded replies) and the test suite's new-domain
script (tests/synthesis_script.py: schema to tasks for a "library" domain),
each `--repeats` times into fresh folders, and reports per script:

  tasks kept per generator call   kept tasks / calls made (all stages)
  cost per kept task              USD at the scripted generator's prices (gpt-5's,
                                  per word rather than per token)
  validation time per task        the task and evolve stages' validation seconds
                                  (JSON, tau2 Task, replay in the probe process) per
                                  task validated, the probe process's start excluded
  probe start                     seconds to start the probe process (imports tau2)
  wall                            the whole run

There is no peer: the release's notebook runs its stages by hand against Azure
endpoints. Medians over the repeats.

  TAU2_DATA_DIR=../shared/tau2-bench/data python -m experiments.benchmarks.synthesize
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

from experiments.benchmarks import common
from experiments.configs import synthesize as configs
from orchestra_jax.synthesis.generator import ScriptedGenerator
from orchestra_jax.synthesis.pipeline import synthesize
from orchestra_jax.synthesis.probe import Prober

PRICE_IN, PRICE_OUT = 1.25, 10.0  # gpt-5, USD per million (words, for the script)


def demo_config(out_dir: str):
    c = configs.get_config("demo")
    c.out_dir = out_dir
    return c, ScriptedGenerator(c.generator.script, price_in=PRICE_IN, price_out=PRICE_OUT)


def library_config(out_dir: str):
    from tests import synthesis_script

    c = configs.get_config("new_domain")
    c.out_dir = out_dir
    c.domain.entry_focuses = "a central branch,a suburban branch,a mobile library"
    c.tasks.num_purposes = 2
    c.attempts = 2
    generator = ScriptedGenerator(synthesis_script.REPLIES, price_in=PRICE_IN, price_out=PRICE_OUT)
    return c, generator


def probe_start_s() -> float:
    prober = Prober()
    start = time.perf_counter()
    prober.run([{"kind": "data_model", "folder": "/nonexistent/none"}])
    seconds = time.perf_counter() - start
    prober.close()
    return seconds


def measure(make, repeats: int) -> dict:
    rows = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as out:
            config, generator = make(out)
            start = time.perf_counter()
            result = synthesize(config, generator)
            wall = time.perf_counter() - start
        stages = result.report["stages"]
        totals = result.report["totals"]
        kept = len(result.tasks)
        validated = sum(stages[s]["validated"] for s in ("tasks", "evolve") if s in stages)
        validation_s = sum(stages[s]["validation_s"] for s in ("tasks", "evolve") if s in stages)
        rows.append(
            {
                "calls": totals["paid_calls"],
                "kept_tasks": kept,
                "kept_per_call": kept / totals["paid_calls"],
                "cost_per_kept_task_usd": totals["cost_usd"] / kept,
                "validation_s_per_task": validation_s / validated,
                "wall_s": wall,
                "rejected": {s: v["rejected"] for s, v in stages.items() if v["rejected"]},
            }
        )
    summary = {
        k: statistics.median(r[k] for r in rows)
        for k in ("kept_per_call", "cost_per_kept_task_usd", "validation_s_per_task", "wall_s")
    }
    return {
        **summary,
        "calls": rows[0]["calls"],
        "kept_tasks": rows[0]["kept_tasks"],
        "rejected": rows[0]["rejected"],
        "runs": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    starts = [probe_start_s() for _ in range(args.repeats)]
    payload = {
        "repeats": args.repeats,
        "probe_start_s": statistics.median(starts),
        "school_demo": measure(demo_config, args.repeats),
        "library_new_domain": measure(library_config, args.repeats),
    }
    path = common.write_result("synthesize", payload)
    print(json.dumps({k: v for k, v in payload.items()}, indent=1, default=str)[:3000])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
