"""One host of a small multi-host job checking the collectives (tests/test_multihost.py).

    python -m launch.local_hosts --num_hosts 2 --devices_per_host 4 -- \
        python tests/multihost_worker.py OUT_DIR

Writes the tiny model's HF export (every host gathers, process 0 writes) to
OUT_DIR/export, and OUT_DIR/host_<i>.json with what this host saw.
"""

import json
import os
import sys


def main(out):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from orchestra_jax.parallel import distributed

    distributed.initialize()
    import jax
    import numpy as np

    from orchestra_jax.models.hf_checkpoint import save_hf_checkpoint
    from orchestra_jax.models.qwen3 import Qwen3Config
    from orchestra_jax.parallel import multihost
    from orchestra_jax.parallel.mesh import batch_sharding, create_sharded_model, make_mesh

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


if __name__ == "__main__":
    main(sys.argv[1])
