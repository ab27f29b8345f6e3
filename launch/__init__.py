"""Launching runs: sweeps over config overrides, TPU pod and GPU node scripts.

Run from the repository root: `python -m launch.sweep --help`. See launch/README.md.
"""
