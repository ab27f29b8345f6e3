"""The agent: one episode of the orchestrator on its tools (turns, context, trajectories, the episode viewer)."""
