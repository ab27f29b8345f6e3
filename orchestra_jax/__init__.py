"""orchestra_jax: train tool-orchestrating Qwen3 policies with GRPO in JAX.

After *ToolOrchestra: Elevating Intelligence via Efficient Model and Tool
Orchestration* (arXiv 2511.21689). See docs/architecture.md for the rooms.
"""

__version__ = "0.1.0"
