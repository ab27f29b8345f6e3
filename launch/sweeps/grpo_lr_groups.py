"""Qwen3-8B GRPO: learning rate × group size G, two seeds each (3 × 3 × 2 = 18 trials).

The reference trains at lr 1e-6 with G = 8; this brackets both. Larger groups
give lower-variance advantages but cost G rollouts per task, so tasks per step
shrink to keep the rollouts per step (tasks × G = 128) fixed — zipped with G.

    python -m launch.sweep --sweep=launch/sweeps/grpo_lr_groups.py \
        --executor=xmanager --xm_platform=vertex --xm_requirements=A100=8
"""

CONFIG = "experiments/configs/grpo_hle.py:qwen3_8b"


def get_sweep(hyper):
    return hyper.product(
        [
            hyper.sweep("config.rl.lr", [3e-7, 1e-6, 3e-6]),
            hyper.zipit(
                [
                    hyper.sweep("config.rl.group_size", [4, 8, 16]),
                    hyper.sweep("config.rl.tasks_per_step", [32, 16, 8]),
                ]
            ),
            hyper.sweep("config.seed", [0, 1]),
        ]
    )
