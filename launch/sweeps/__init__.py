"""Sweep files: each defines `get_sweep(hyper)` returning a list of override dicts."""
