"""ToolScale-style synthesis of τ² domains and their tasks by a generator model."""
