r"""Serve a trained orchestrator (docs/serving.md).

  python -m orchestra_jax.serve --config=experiments/configs/grpo_hle.py:demo \
      --policy=checkpoint:runs/demo [--host=127.0.0.1 --port=8000]

--policy: checkpoint:<workdir> (its latest GRPO checkpoint), hf:<folder> or
hf:<base>+<adapter>. The catalogue, search index, sandbox, expert endpoints,
engine, sampling and limits are the config's evaluation's. Beyond loopback the
server needs an API key in the variable --api_key_env names.
"""

import asyncio
import logging
import signal

from absl import flags
from ml_collections import config_flags

from orchestra_jax.training import cli

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config: path/to/config.py:variant.", lock_config=True
)
_POLICY = flags.DEFINE_string(
    "policy", None, "checkpoint:<workdir>, hf:<folder> or hf:<base>+<adapter>."
)
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to bind; beyond loopback needs a key.")
_PORT = flags.DEFINE_integer("port", 8000, "Port to bind.")
_API_KEY_ENV = flags.DEFINE_string(
    "api_key_env",
    "ORCHESTRA_SERVE_API_KEY",
    "The environment variable holding the API key requests must carry (unset or empty: none).",
)
_MAX_BODY = flags.DEFINE_integer("max_body_bytes", 2**20, "Larger request bodies get a 413.")
_MAX_CONCURRENT = flags.DEFINE_integer(
    "max_concurrent", 32, "Requests answered at once; one more gets a 429."
)


async def _serve(server, host, port):
    from orchestra_jax.serve.app import start

    runner, url = await start(server, host, port)
    logging.info("serving %s on %s (the page at %s/)", server.orchestrator.name, url, url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()  # requests in flight are cancelled
    close = getattr(server.orchestrator.engine, "close", None)
    if close is not None:
        await asyncio.to_thread(close)


def main(argv):
    del argv
    from orchestra_jax.serve.app import OrchestratorServer, ServeConfig, api_key_from
    from orchestra_jax.serve.build import build_orchestrator
    from orchestra_jax.training.policy_engines import PolicyError, is_policy
    from orchestra_jax.training.policy_push import PolicyNotServed

    policy = _POLICY.value or ""
    if not is_policy(policy) or policy == "checkpoint":
        raise SystemExit(
            f"error: --policy={policy!r}; one of checkpoint:<workdir>, hf:<folder>, "
            "hf:<base>+<adapter>"
        )
    api_key = api_key_from(_API_KEY_ENV.value, _HOST.value)  # before minutes of loading
    config = ServeConfig(
        max_body_bytes=_MAX_BODY.value, max_concurrent=_MAX_CONCURRENT.value, api_key=api_key
    )
    try:
        orchestrator = build_orchestrator(cli.validated(_CONFIG.value), policy)
    except (PolicyError, PolicyNotServed, ValueError) as e:
        raise SystemExit(f"error: {e}") from e
    asyncio.run(_serve(OrchestratorServer(orchestrator, config), _HOST.value, _PORT.value))


if __name__ == "__main__":
    cli.run(main)
