"""Where model-written Python runs: the sandbox registry and its back-ends (bubblewrap, WebAssembly, rlimits), with a memo in front."""
