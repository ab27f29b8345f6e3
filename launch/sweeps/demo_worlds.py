"""The demo on three worlds it was never tuned on, three training seeds each.

A world is the synthetic environment's organisations, corpus and tasks
(`data.synthetic_seed`) with its held-out test (`eval.seed`). The demo's settings
were chosen on world 0 and, later, on world 404; worlds 101, 202 and 303 were
fixed before any setting was looked at on them and are never tuned on.

    python -m launch.sweep --sweep=launch/sweeps/demo_worlds.py --executor=local \
        --workdir_root=runs/sweeps
    python -m experiments.benchmarks.demo_learning runs/sweeps/demo_worlds
"""

CONFIG = "experiments/configs/grpo_hle.py:demo"
WORLDS = [101, 202, 303]


def get_sweep(hyper):
    return hyper.product(
        [
            hyper.zipit(
                [
                    hyper.sweep("config.data.synthetic_seed", WORLDS),
                    hyper.sweep("config.eval.seed", WORLDS),
                ]
            ),
            hyper.sweep("config.seed", [0, 1, 2]),
        ]
    )
