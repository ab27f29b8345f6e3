"""The demo config with three seeds: how much of a result is seed noise.

python -m launch.sweep --sweep=launch/sweeps/demo_seeds.py --executor=local --max_parallel=3
"""

CONFIG = "experiments/configs/grpo_hle.py:demo"


def get_sweep(hyper):
    return hyper.sweep("config.seed", [0, 1, 2])
