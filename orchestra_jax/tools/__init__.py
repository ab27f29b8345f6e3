"""The orchestrator's tools: configurations and prices, experts, retrieval, the Python sandbox, meta-tools."""
