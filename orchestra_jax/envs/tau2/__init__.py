"""τ²-bench conversations: the environment, one conversation's state, the user simulator, the domain's tools and domain folders."""
