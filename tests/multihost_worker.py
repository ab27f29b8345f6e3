"""One host of a small multi-host job checking the collectives (tests/test_multihost.py).

    python -m launch.local_hosts --num_hosts 2 --devices_per_host 4 -- \
        python tests/multihost_worker.py OUT_DIR

Writes the tiny model's HF export (every host gathers, process 0 writes) to
OUT_DIR/export, and OUT_DIR/host_<i>.json with what this host saw; then runs
`warm_start_and_evaluate` (the `micro` variant's warm start and held-out
evaluations, each host playing its share) in OUT_DIR/run, where process 0
writes the warm-start parameters (params.npz) beside the evaluations' files.
"""

import json
import os
import sys


def warm_start_and_evaluate(workdir):
    """The `micro` variant's warm start (router demonstrations, a few SFT steps) and
    held-out evaluations of the warm-start policy and a baseline router; returns
    (the learner's parameters as NumPy arrays, the evaluations' summaries)."""
    import jax
    import numpy as np

    from experiments.configs import grpo_hle
    from orchestra_jax.parallel import multihost
    from orchestra_jax.training import experiment, loop_steps

    config = grpo_hle.get_config("micro")
    config.workdir = str(workdir)
    config.sft.steps = 2
    config.sft.num_demos = 8
    config.sft.batch_size = 8
    config.eval.num_tasks = 5  # an uneven split: 3 tasks on host 0, 2 on host 1
    run = loop_steps.setup_run(config)
    experiment.run_warm_start(config, run)
    params = [multihost.gather_to_host(x) for x in jax.tree.leaves(run.learner.params)]
    evaluator = experiment.build_evaluator(config, run.env, run.tokenizer)
    summaries = {"warm_start": experiment.evaluate(evaluator, "warm_start", run.engine)}
    router = experiment.baseline_router(config, "random", run.tokenizer, evaluator.tool_configs)
    summaries["random"] = experiment.evaluate(evaluator, "random", router)
    router.close()
    run.engine.close()
    if multihost.is_primary():
        np.savez(os.path.join(workdir, "params.npz"), *params)
    return params, summaries


def main(out):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from orchestra_jax.parallel import distributed

    distributed.initialize()
    import jax
    import numpy as np

    from orchestra_jax.models.hf_checkpoint import save_hf_checkpoint
    from orchestra_jax.models.qwen3.model import Qwen3Config, create_sharded_model
    from orchestra_jax.parallel import multihost
    from orchestra_jax.parallel.mesh import batch_sharding, make_mesh

    host = jax.process_index()
    mesh = make_mesh(fsdp=-1)
    config = Qwen3Config.preset("tiny")
    model = create_sharded_model(config, mesh, seed=0)
    files = save_hf_checkpoint(model, config, os.path.join(out, "export"))
    parts = multihost.exchange([f"host {host}", {"n": host}])
    batch = {"ids": np.arange(16 * 3, dtype=np.int32).reshape(16, 3) + 100 * host}
    try:
        multihost.global_batch(batch, batch_sharding(mesh))
        mismatch = ""
    except RuntimeError as e:
        mismatch = str(e)
    same = multihost.global_batch({"ids": batch["ids"] % 100}, batch_sharding(mesh))["ids"]
    local = [np.asarray(s.data).tolist() for s in same.addressable_shards]
    with open(os.path.join(out, f"host_{host}.json"), "w") as f:
        json.dump(
            {
                "files": [str(p) for p in files],
                "parts": parts,
                "mismatch": mismatch,
                "local_rows": local,
            },
            f,
        )
    _, summaries = warm_start_and_evaluate(os.path.join(out, "run"))
    with open(os.path.join(out, f"summaries_{host}.json"), "w") as f:
        json.dump(summaries, f)


if __name__ == "__main__":
    main(sys.argv[1])
