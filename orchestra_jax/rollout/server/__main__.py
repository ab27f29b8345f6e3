"""`python -m orchestra_jax.rollout.server`: serve a model over SGLang's native HTTP protocol."""

from orchestra_jax.rollout.server.app import main

if __name__ == "__main__":
    main()
