#!/usr/bin/env bash
# Run the training job on one multi-GPU node: the JAX learner on LEARNER_GPUS,
# rollouts either in process (the JAX engine) or on SGLang servers.
#
# With SGLANG_URLS set, the script waits until every server answers /health, then
# starts the job with
#   --config.rollout.engine=sglang --config.rollout.urls=$SGLANG_URLS
#   --config.rollout.weights_dir=$SGLANG_WEIGHTS_DIR
# (the learner writes new weights there and the servers reload them, so the folder
# must be readable by the servers). Start the servers first, on GPUs the learner
# does not use, e.g. with launch/sglang_server.sh.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: [LEARNER_GPUS=0,1,2,3] [SGLANG_URLS=http://localhost:30000,...] \
         launch/gpu_node.sh [--install] [--] [FLAGS...]

Runs `python3 -m $MODULE FLAGS...` on this node, one process seeing LEARNER_GPUS.

Options:
  --install    pip install -e ".[gpu]" first
  -h, --help   this message

Environment:
  LEARNER_GPUS          CUDA devices for the JAX learner (default: all visible GPUs)
  SGLANG_URLS           comma-separated SGLang server URLs; unset = in-process JAX rollouts
  SGLANG_WAIT_S         seconds to wait for the servers' /health (default: 900)
  SGLANG_WEIGHTS_DIR    where weights are written for the servers to reload
                        (default: $TMPDIR/orchestra_jax_weights, fine on one node)
  XLA_PYTHON_CLIENT_MEM_FRACTION  share of each learner GPU JAX may take (default: 0.90)
  MODULE                python module to run (default: experiments.grpo_hle)
  DRY_RUN=1             print the commands instead of running them

Example (learner on GPUs 0-3, two SGLang servers on GPUs 4-5 and 6-7):
  LEARNER_GPUS=0,1,2,3 SGLANG_URLS=http://localhost:30000,http://localhost:30001 \
      launch/gpu_node.sh -- --config=experiments/configs/grpo_hle.py:qwen3_8b \
      --config.workdir=/data/runs/8b
EOF
}

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# Polls <url>/health until it answers 200, or dies after SGLANG_WAIT_S seconds.
wait_for_server() {
  local url="${1%/}" deadline=$((SECONDS + ${SGLANG_WAIT_S:-900}))
  [[ "${DRY_RUN:-0}" == "1" ]] && { echo "+ wait for ${url}/health"; return 0; }
  until curl --silent --fail --max-time 5 "${url}/health" >/dev/null; do
    ((SECONDS < deadline)) || die "no healthy SGLang server at ${url} after ${SGLANG_WAIT_S:-900}s"
    sleep 5
  done
  echo "gpu_node.sh: ${url} is healthy" >&2
}

install=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --install) install=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) break ;;  # the first unknown argument starts the job's own flags
  esac
done

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${repo_root}"
module="${MODULE:-experiments.grpo_hle}"

if [[ "${install}" == "1" ]]; then
  run python3 -m pip install --quiet -e '.[gpu]'
fi

if [[ -n "${LEARNER_GPUS:-}" ]]; then
  [[ "${LEARNER_GPUS}" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "LEARNER_GPUS must look like 0,1,2,3, got '${LEARNER_GPUS}'"
  export CUDA_VISIBLE_DEVICES="${LEARNER_GPUS}"
fi
# JAX preallocates 75% of each GPU by default; a dedicated learner can take more.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.90}"

rollout_flags=()
if [[ -n "${SGLANG_URLS:-}" ]]; then
  command -v curl >/dev/null || [[ "${DRY_RUN:-0}" == "1" ]] || die "curl is needed to check the SGLang servers"
  IFS=',' read -r -a urls <<<"${SGLANG_URLS}"
  for url in "${urls[@]}"; do
    [[ "${url}" =~ ^https?:// ]] || die "SGLANG_URLS entries must start with http:// or https://, got '${url}'"
    wait_for_server "${url}"
  done
  weights_dir="${SGLANG_WEIGHTS_DIR:-${TMPDIR:-/tmp}/orchestra_jax_weights}"
  run mkdir -p "${weights_dir}"
  rollout_flags=(--config.rollout.engine=sglang "--config.rollout.urls=${SGLANG_URLS}"
                 "--config.rollout.weights_dir=${weights_dir}")
fi

echo "gpu_node.sh: learner on CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-<all>}" >&2
# Rollout flags last: ml_collections applies --config.a.b overrides after --config loads.
run python3 -m "${module}" "$@" "${rollout_flags[@]}"
