"""End to end: the `micro` config with the reference's rebuilt prompts and turn samples."""

import json
import math
import os

import pytest

from orchestra_jax.agent.context import RebuildContext
from orchestra_jax.agent.trajectory import read_jsonl
from orchestra_jax.config_section import ConfigError
from orchestra_jax.rl.samples import turn_samples
from orchestra_jax.training import builders, grpo_loop, loop_steps
from tests.test_training_e2e import NoiseReward, micro_config

REFERENCE = {
    "agent.context": "rebuild",
    "rl.sample_unit": "turn",
    "rl.minibatch_size": 2,
    "rl.share_prompts": False,
    "rl.warmup_steps": 0,  # the schedule counts updates, which vary from step to step
    "num_steps": 1,
}


@pytest.mark.parametrize("pack, share", [(False, False), (True, False), (True, True)])
def test_a_step_with_rebuilt_prompts_trains_turn_samples(tmp_path, pack, share):
    config = micro_config(tmp_path, **REFERENCE, **{"rl.pack": pack, "rl.share_prefixes": share})
    run = loop_steps.setup_run(config)
    assert isinstance(builders.loop_limits(config).context, RebuildContext)
    run.reward_fn = NoiseReward()
    try:
        grpo_loop.grpo_train(run)
    finally:
        run.engine.close()
    [line] = [json.loads(x) for x in open(os.path.join(tmp_path, "metrics.jsonl"))]
    trajs = read_jsonl(os.path.join(tmp_path, "trajectories", "step_000001.jsonl"))
    kept = [t for t in trajs if t.advantage]  # micro keeps every group (format filter off)
    samples = turn_samples(kept)
    assert line["learner/samples"] == len(samples) > len(kept)
    assert line["learner/updates"] == math.ceil(len(samples) / 2) > 1
    assert line["learner/skipped"] == 0
    # Packed or not, each mini-batch fills a whole number of rows a batch shard.
    assert (
        line["learner/batch_rows"] % (line["learner/updates"] * run.learner.num_batch_shards) == 0
    )
    # Each sample's positions once, or (shared prefixes) its rebuilt prompt's common
    # start with the step's other turns once.
    positions = sum(len(s.token_ids) - 1 for s in samples)
    assert (line["learner/written_positions"] < positions) == share
    assert line["learner/written_positions"] <= positions
    rebuilt = [t for t in trajs if len(t.turns) > 1]
    assert rebuilt, "no episode reached a second turn"
    for traj in rebuilt:
        first, second = traj.turns[:2]
        assert second.prompt_start == first.prompt_tokens + first.num_generated_tokens
        prompt = run.tokenizer.decode(
            traj.token_ids[second.prompt_start : second.prompt_start + second.prompt_tokens]
        )
        assert "You are good at using tools." in prompt and "Choose an approriate tool." in prompt
        assert "Problem: " in prompt and first.text not in prompt  # never its own turns


def test_rebuild_without_turn_samples_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError) as e:
        micro_config(tmp_path, **{**REFERENCE, "rl.sample_unit": "episode"})
    [line] = [x for x in str(e.value).splitlines() if "agent.context" in x]
    assert "rl.sample_unit='turn'" in line
    with pytest.raises(ConfigError, match="rl.share_prompts"):
        micro_config(tmp_path, **{**REFERENCE, "rl.share_prompts": True})
    with pytest.raises(ConfigError, match="agent.context"):
        micro_config(tmp_path, **{**REFERENCE, "agent.context": "nope"})
