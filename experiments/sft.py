r"""Supervised warm start on demonstration episodes; writes a Hugging Face checkpoint.

  # demonstrations played by a router in the offline environment (config.sft.*)
  python -m experiments.sft --config=experiments/configs/grpo_hle.py:demo
  # or any jsonl of chat conversations: {"messages": [...], "tools": [...]} per line
  python -m experiments.sft --config=... --demos=/data/demos.jsonl

The loss covers the assistant's tokens only, for `sft.steps` steps (> 0: a
config whose warm start is off, `sft.steps=0`, is an error here, never an
untrained model written as if trained). The result goes to
<workdir>/sft_hf (config.json + safetensors), loadable by transformers, SGLang,
`experiments.evaluate --policies=hf:<workdir>/sft_hf`, or as
`--config.model.hf_path` of a GRPO run.
"""

import json
import logging
import math
import sys

from absl import flags
from ml_collections import config_flags

from orchestra_jax.training import cli

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config: path/to/config.py:variant.", lock_config=True
)
_DEMOS = flags.DEFINE_string(
    "demos",
    "",
    "jsonl of {'messages': [...], 'tools': [...]}; "
    "empty: router demonstrations from the offline environment.",
)


def read_conversations(path, tokenizer, enable_thinking):
    from orchestra_jax.training.warm_start import conversation_example

    examples, bad = [], 0
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                examples.append(
                    conversation_example(
                        row["messages"],
                        tokenizer,
                        tools=row.get("tools"),
                        enable_thinking=enable_thinking,
                    )
                )
            except (ValueError, KeyError, TypeError) as e:
                bad += 1
                if bad <= 5:
                    logging.warning("%s:%d: skipped: %s", path, lineno, e)
    logging.info("%s: %d conversations, %d malformed rows skipped", path, len(examples), bad)
    return examples


def no_steps_error(config, demos_path: str) -> str | None:
    """Why this config trains nothing here (`sft.steps` <= 0), with the steps of one
    pass over the demonstrations as a suggestion; None when it trains."""
    steps, batch = config.sft.steps, config.sft.batch_size
    if steps > 0:
        return None
    if demos_path:
        with open(demos_path, encoding="utf-8") as f:
            count = sum(1 for line in f if line.strip())
        where = f"the {count} conversations in {demos_path}"
    else:
        count = config.sft.num_demos
        where = f"sft.num_demos={count} demonstrations"
    return (
        f"error: sft.steps={steps}: experiments.sft would train no step and write the "
        "untrained model. Set --config.sft.steps=N; one pass over "
        f"{where} at sft.batch_size={batch} is {max(1, math.ceil(count / batch))} steps."
    )


def main(argv):
    del argv
    cli.init_distributed(_CONFIG.value)
    from orchestra_jax.io import paths
    from orchestra_jax.models.hf_checkpoint import save_hf_checkpoint
    from orchestra_jax.rl.learner import Learner
    from orchestra_jax.training import builders, experiment, loop_steps, warm_start

    config = cli.validated(_CONFIG.value)
    error = no_steps_error(config, _DEMOS.value)
    if error:
        sys.exit(error)
    workdir = loop_steps.workdir_of(config)
    if _DEMOS.value:
        tokenizer = builders.build_tokenizer(config)
        mesh = builders.build_mesh(config)
        model, model_config = builders.build_model(config, mesh, tokenizer)
        examples = read_conversations(_DEMOS.value, tokenizer, config.agent.enable_thinking)
        learner = Learner(model, builders.build_sft_learner_config(config), mesh=mesh)
        batching = builders.build_batching(config, learner.row_multiple(config.sft.batch_size))
        warm_start.run_sft(
            learner,
            examples,
            batch_size=config.sft.batch_size,
            steps=config.sft.steps,
            seed=config.seed,
            batching=batching,
            on_step=lambda s, m: s % 10 or logging.info("step %d loss %.4f", s, m["loss"]),
            ema_decay=config.sft.ema_decay,
        )
    else:
        run = loop_steps.setup_run(config)
        experiment.run_warm_start(config, run)
        model, model_config = run.model, run.model_config
    out = paths.join(workdir, "sft_hf")
    save_hf_checkpoint(model, model_config, out)
    logging.info("wrote %s", out)


if __name__ == "__main__":
    cli.run(main)
