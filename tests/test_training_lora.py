"""LoRA GRPO end to end: the JAX engine samples with the adapters, a LoRA run trains
adapters alone, resumes exactly, writes a PEFT folder that evaluation loads."""

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchestra_jax.models import peft_adapter
from orchestra_jax.models.hf_checkpoint import save_hf_checkpoint
from orchestra_jax.models.lora import LoRAParam, LoRASpec
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.rollout.engine import GenerateRequest, SamplingParams
from orchestra_jax.rollout.jax.engine import JaxEngine, JaxEngineConfig
from orchestra_jax.training import builders, grpo_loop, loop_steps
from orchestra_jax.training.checkpointing import Checkpointer
from tests.resume_worker import ranked_reward
from tests.test_training_e2e import micro_config

LORA = {"lora.rank": 4, "lora.alpha": 8.0, "agent.seconds_per_generated_token": 0.02}


def adapters(model):
    return jax.tree.map(np.asarray, jax.device_get(nnx.state(model, LoRAParam)))


def randomise_adapters(model, seed=0):
    rng = np.random.default_rng(seed)
    nnx.update(
        model,
        nnx.from_flat_state(
            [
                (k, v.replace(jnp.asarray(0.2 * rng.standard_normal(v.shape), jnp.float32)))
                for k, v in nnx.to_flat_state(nnx.state(model, LoRAParam))
            ]
        ),
    )


def test_jax_engine_samples_with_the_adapters_and_swaps_a_peft_folder_in(tmp_path):
    config = Qwen3Config.preset("tiny", lora=LoRASpec(rank=4, alpha=8.0))
    trained = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    randomise_adapters(trained)
    peft_adapter.save_adapter(trained, tmp_path / "v1")
    engine = JaxEngine(
        Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)),  # the same base, adapters at B = 0
        JaxEngineConfig(max_batch_size=2, max_seq_len=64),
    )
    prompt = [5, 9, 33, 7]
    request = GenerateRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=6))
    try:
        asyncio.run(engine.generate([request]))
        asyncio.run(engine.update_adapter(tmp_path / "v1", version=1))
        [completion] = asyncio.run(engine.generate([request]))
    finally:
        engine.close()
    assert completion.weight_version == 1
    ids = np.asarray(prompt + list(completion.output_ids))
    logits = trained(jnp.asarray(ids[None, :-1]), jnp.arange(len(ids) - 1)[None])
    logp = jax.nn.log_softmax(logits[0], axis=-1)
    want = [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(completion.output_ids)]
    np.testing.assert_allclose(completion.logprobs, want, atol=1e-4)
    assert list(completion.output_ids) == [int(np.argmax(logp[len(prompt) - 1]))] + list(
        completion.output_ids[1:]
    )


def lora_run(workdir, steps):
    config = micro_config(workdir, num_steps=steps, **LORA)
    run = loop_steps.setup_run(config)
    run.reward_fn = ranked_reward
    grpo_loop.grpo_train(run)
    run.engine.close()
    return config, run


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    return lora_run(tmp_path_factory.mktemp("whole"), 2)


def test_a_lora_run_trains_adapters_alone_and_writes_them(whole):
    config, run = whole
    assert run.learner.lora
    fresh, _ = builders.build_model(config, run.mesh, builders.build_tokenizer(config))
    base = lambda m: jax.device_get(nnx.state(m, nnx.Not(LoRAParam)))  # noqa: E731
    for a, b in zip(jax.tree.leaves(base(fresh)), jax.tree.leaves(base(run.model))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # the base: bitwise
    trained = adapters(run.model)
    assert any(np.abs(x).max() > 0 for x in jax.tree.leaves(trained["model"]))
    with Checkpointer(loop_steps.paths.join(config.workdir, "checkpoints")) as ckpt:
        saved = ckpt.restore(2).params  # adapters alone: 7 projections x A, B x 2 layers
    assert len(jax.tree.leaves(saved)) == 28
    folder = loop_steps.adapter_dir(config)
    spec = peft_adapter.read_spec(folder)
    assert (spec.rank, spec.alpha) == (4, 8.0)
    peft_adapter.load_adapter(fresh, folder)
    jax.tree.map(np.testing.assert_array_equal, adapters(fresh), trained)


def test_a_lora_run_resumes_with_its_adapters_and_optimizer_state_exactly(whole):
    # What a resumed run continues from (the loop's resume itself: test_training_resume).
    config, run = whole
    resumed = loop_steps.setup_run(config)
    try:
        assert loop_steps.restore(resumed, loop_steps.train_task_iterator(resumed.sections)) == 2
        same = lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # noqa: E731
        jax.tree.map(same, resumed.learner.params, run.learner.params)
        jax.tree.map(same, resumed.learner.opt_state, run.learner.opt_state)
        jax.tree.map(same, resumed.learner.ref_params, run.learner.ref_params)
        # The engine samples with the restored adapters on the same base.
        engine = jax.tree.leaves(jax.device_get(resumed.engine._state))
        model = jax.tree.leaves(jax.device_get(nnx.state(run.model, nnx.Param)))
        assert len(engine) == len(model)
        jax.tree.map(same, engine, model)
    finally:
        resumed.engine.close()


def _first_turn_logprobs(model, traj, temperature):
    """log p(token) of the episode's first generated turn under `model` at `temperature`
    (the sampler's log_softmax(logits / T), rollout/jax/sampling.py)."""
    n = traj.turns[0].num_generated_tokens
    ids = jnp.asarray(traj.token_ids[: traj.prompt_length + n])
    logits = model(ids[None, :-1], jnp.arange(len(ids) - 1)[None])[0]
    logp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
    rows = jnp.arange(traj.prompt_length - 1, traj.prompt_length - 1 + n)
    return np.asarray(logp[rows, ids[rows + 1]])


def test_evaluation_of_a_base_folder_plus_an_adapter_samples_the_merged_model(tmp_path):
    import json

    from experiments.evaluate import evaluate_policies
    from orchestra_jax.agent.trajectory import read_jsonl
    from orchestra_jax.models.hf_checkpoint import load_hf_checkpoint

    plain = micro_config(tmp_path, **{"lora.rank": 0})
    mesh = builders.build_mesh(plain)
    base, base_config = builders.build_model(plain, mesh, builders.build_tokenizer(plain))
    save_hf_checkpoint(base, base_config, tmp_path / "base")
    # An adapter far from the base, published as PEFT's usual settings write it.
    adapted, _ = load_hf_checkpoint(tmp_path / "base", lora=LoRASpec(rank=4, alpha=8.0))
    randomise_adapters(adapted)
    peft_adapter.save_adapter(adapted, tmp_path / "adapter")
    settings = tmp_path / "adapter" / "adapter_config.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "lora_dropout": 0.05}))
    eval_config = micro_config(tmp_path / "eval", **{"eval.num_tasks": 2})
    policy = f"hf:{tmp_path / 'base'}+{tmp_path / 'adapter'}"
    summaries = evaluate_policies(eval_config, [policy])
    assert list(summaries) == ["hf_base+adapter"]
    assert summaries["hf_base+adapter"]["adapter"] == str(tmp_path / "adapter")
    played = read_jsonl(
        loop_steps.paths.join(loop_steps.workdir_of(eval_config), "trajectories")
        + "/eval_hf_base+adapter.jsonl"
    )
    peft_adapter.merge_to_hf(tmp_path / "base", tmp_path / "adapter", tmp_path / "merged")
    merged, _ = load_hf_checkpoint(tmp_path / "merged")
    temperature = eval_config.eval.temperature
    assert played and all(t.turns and t.turns[0].num_generated_tokens for t in played)
    for traj in played:  # what the evaluated policy sampled, as the engine reported it
        n = traj.turns[0].num_generated_tokens
        sampled = traj.rollout_logprobs[traj.prompt_length : traj.prompt_length + n]
        np.testing.assert_allclose(
            sampled, _first_turn_logprobs(merged, traj, temperature), atol=2e-4, rtol=0
        )
        assert np.abs(sampled - _first_turn_logprobs(base, traj, temperature)).max() > 0.05


def test_lora_config_errors_name_the_fields(tmp_path):
    with pytest.raises(Exception) as e:
        micro_config(
            tmp_path,
            **{
                "lora.rank": 4,
                "lora.dropout": 0.1,
                "lora.targets": "q,lm_head",
                "rollout.engine": "scripted",
            },
        )
    for needle in ("lora.dropout", "lora.targets", "rollout.engine='scripted' with lora.rank"):
        assert needle in str(e.value)


def test_lora_demo_runs_grpo_steps(tmp_path):
    from experiments.configs import grpo_hle
    from orchestra_jax.training.experiment_config import validate

    config = grpo_hle.get_config("lora_demo")
    config.workdir, config.num_steps, config.rl.warmup_steps = str(tmp_path), 2, 1
    config.rl.tasks_per_step, config.rl.micro_batch_size = 2, 1
    config.agent.max_turns = 2
    config.rl.format_filter = "off"  # a random policy writes no well-formed call
    validate(config)
    run = loop_steps.setup_run(config)
    run.reward_fn = ranked_reward
    try:
        before = adapters(run.model)
        assert grpo_loop.grpo_train(run) == 2
    finally:
        run.engine.close()
    after = adapters(run.model)
    assert any(
        not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after))
    )
    assert peft_adapter.read_spec(loop_steps.adapter_dir(config)).rank == 8


def test_an_async_lora_run_of_turn_samples_in_minibatches_trains_adapters(tmp_path):
    overrides = {
        "rl.max_staleness": 1,
        "agent.context": "rebuild",
        "rl.sample_unit": "turn",
        "rl.minibatch_size": 2,
        "rl.share_prompts": False,
        "rl.warmup_steps": 0,
    }
    config = micro_config(tmp_path, num_steps=2, **LORA, **overrides)
    run = loop_steps.setup_run(config)
    run.reward_fn = ranked_reward
    try:
        before = adapters(run.model)
        grpo_loop.grpo_train(run)
    finally:
        run.engine.close()
    after = adapters(run.model)
    assert any(
        not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after))
    )
    # The engine's adapters are the learner's last ones (weight sync by version).
    assert run.engine.weight_version == 2
    engine = dict(
        nnx.to_flat_state(nnx.state(nnx.merge(run.engine._graphdef, run.engine._state), LoRAParam))
    )
    for key, value in nnx.to_flat_state(nnx.state(run.model, LoRAParam)):
        np.testing.assert_array_equal(
            np.asarray(engine[key].get_value()), np.asarray(value.get_value())
        )
    peft_adapter.read_spec(loop_steps.adapter_dir(config))
