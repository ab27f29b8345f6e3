#!/usr/bin/env bash
# The style checks CI runs: one formatter, a linter and a type checker, all configured
# in pyproject.toml. Install them with `pip install -e .[lint]`. Exits non-zero on the
# first check that fails.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== ruff format --check"
ruff format --check .
echo "== ruff check"
ruff check .
echo "== basedpyright (orchestra_jax/)"
basedpyright
