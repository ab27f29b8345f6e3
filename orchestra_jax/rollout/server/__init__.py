"""The project's rollout server: any RolloutEngine over SGLang's native HTTP protocol and OpenAI chat (`python -m orchestra_jax.rollout.server`)."""
