"""The trained orchestrator as a service: OpenAI chat completions answered by orchestrating.

    python -m orchestra_jax.serve --config=experiments/configs/grpo_hle.py:demo \
        --policy=checkpoint:runs/demo

`request.py` reads a request, `service.py` plays its episode on the shared engine,
`app.py` speaks HTTP, `build.py` builds it all from an experiment config. The
contract: docs/serving.md.
"""
