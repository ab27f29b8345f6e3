"""Rollout engines over HTTP: vLLM and SGLang (or the project's own server) clients, server choice and failover, verified weight syncs."""
