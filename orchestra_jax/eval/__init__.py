"""Evaluation: baseline routers, pass^k, the held-out summary and its report."""
