"""Environments: the task sources with their tools and grading (synthetic world, QA, τ²-bench domains, routed mixtures)."""
