"""The demo's candidate warm start on three fresh worlds, three training seeds each.

The candidate and the worlds were fixed before any run on them
(`docs/notes/2026-11-28-demo-untuned-worlds-preregistered.md`): the warm start
imitates the two plan shapes (`random_answer+direct_strongest`) unfiltered for 300
SFT steps; every other setting is the demo's. Worlds 909, 1010 and 1111 had never
been run.

    python -m launch.sweep --sweep=launch/sweeps/demo_fresh_worlds.py --executor=local \
        --workdir_root=runs/sweeps
    python -m experiments.benchmarks.demo_learning runs/sweeps/demo_fresh_worlds
"""

CONFIG = "experiments/configs/grpo_hle.py:demo"
WORLDS = [909, 1010, 1111]


def get_sweep(hyper):
    return hyper.product(
        [
            hyper.sweep("config.sft.demo_policy", ["random_answer+direct_strongest"]),
            hyper.sweep("config.sft.demo_filter", ["none"]),
            hyper.sweep("config.sft.steps", [300]),
            hyper.zipit(
                [
                    hyper.sweep("config.data.synthetic_seed", WORLDS),
                    hyper.sweep("config.eval.seed", WORLDS),
                ]
            ),
            hyper.sweep("config.seed", [0, 1, 2]),
        ]
    )
