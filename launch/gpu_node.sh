#!/usr/bin/env bash
# Run the training job on one multi-GPU node: the JAX learner on LEARNER_GPUS,
# rollouts either in process (the JAX engine) or on SGLang servers.
#
# SGLang servers: with SGLANG_GPUS (and SGLANG_MODEL, the HF folder they start
# from), this script starts one server per SGLANG_TP of those GPUs with
# launch/sglang_server.sh on ports SGLANG_PORT, SGLANG_PORT + 1, ..., and stops
# them when the learner exits. Servers started elsewhere are named in
# SGLANG_URLS. Either way the script waits until every server answers /health,
# then starts the job with
#   --config.rollout.engine=sglang --config.rollout.urls=<the servers>
#   --config.rollout.weights_dir=$SGLANG_WEIGHTS_DIR
# (the learner writes new weights there and the servers reload them, so the
# folder must be readable by every server; on several nodes, a shared file system).
#
# The servers started here listen on loopback (URLs http://127.0.0.1:<port>) on
# one node; on several (JAX_NUM_PROCESSES > 1) every learner uses every node's
# servers, so they listen on SGLANG_HOST (default 0.0.0.0, URLs
# http://<hostname>:<port>) and need ROLLOUT_API_KEY, which the servers require
# and the learners send (launch/README.md, "Access to the servers").
#
# Several nodes: one copy of this script per node (launch/slurm_gpu.sbatch does
# this with srun). JAX_COORDINATOR_ADDRESS and JAX_NUM_PROCESSES pass through to
# the learner; JAX_PROCESS_ID defaults to Slurm's SLURM_PROCID.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: [LEARNER_GPUS=0,1,2,3] [SGLANG_GPUS=4,5,6,7 SGLANG_MODEL=/ckpt/Qwen3-8B] \
         [SGLANG_URLS=http://host:30000,...] launch/gpu_node.sh [--install] [--] [FLAGS...]

Runs `python3 -m $MODULE FLAGS...` on this node, one process seeing LEARNER_GPUS.

Options:
  --install    pip install -e ".[gpu]" first
  -h, --help   this message

Environment:
  LEARNER_GPUS          CUDA devices for the JAX learner (default: all visible GPUs)
  SGLANG_GPUS           CUDA devices for SGLang servers this script starts (needs SGLANG_MODEL)
  SGLANG_MODEL          HF folder the servers start from (the policy's initial weights)
  SGLANG_TP             GPUs per server (default 1; tensor parallel inside SGLang)
  SGLANG_PORT           first server's port (default 30000)
  SGLANG_URLS           comma-separated server URLs the learner uses (default: the
                        servers started here); unset with no SGLANG_GPUS = JAX rollouts
  SGLANG_HOST           the address the servers started here listen on (default:
                        127.0.0.1 on one node, 0.0.0.0 on several)
  ROLLOUT_API_KEY       the key the servers require and the learner sends (required
                        when the servers listen beyond loopback)
  SGLANG_WAIT_S         seconds to wait for the servers' /health (default: 900)
  SGLANG_WEIGHTS_DIR    where weights are written for the servers to reload
                        (default: $TMPDIR/orchestra_jax_weights, fine on one node)
  LOG_DIR               server logs (default: logs/)
  XLA_PYTHON_CLIENT_MEM_FRACTION  share of each learner GPU JAX may take (default: 0.90)
  MODULE                python module to run (default: experiments.grpo_hle)
  DRY_RUN=1             print the commands instead of running them

Example (learner on GPUs 0-3, four SGLang servers on GPUs 4-7):
  LEARNER_GPUS=0,1,2,3 SGLANG_GPUS=4,5,6,7 SGLANG_MODEL=/ckpt/Qwen3-8B \
      launch/gpu_node.sh -- --config=experiments/configs/grpo_hle.py:qwen3_8b \
      --config.model.hf_path=/ckpt/Qwen3-8B --config.workdir=/data/runs/8b
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
gpu_list='^[0-9]+(,[0-9]+)*$'

if [[ "${install}" == "1" ]]; then
  run python3 -m pip install --quiet -e '.[gpu]'
fi

# --- SGLang servers on this node ----------------------------------------------------
server_pids=()
stop_servers() {
  for pid in "${server_pids[@]}"; do kill "${pid}" 2>/dev/null || true; done
}
trap stop_servers EXIT
local_urls=()
if [[ -n "${SGLANG_GPUS:-}" ]]; then
  [[ "${SGLANG_GPUS}" =~ ${gpu_list} ]] || die "SGLANG_GPUS must look like 4,5,6,7, got '${SGLANG_GPUS}'"
  [[ -n "${SGLANG_MODEL:-}" ]] || die "SGLANG_GPUS needs SGLANG_MODEL, the HF folder the servers start from"
  tp="${SGLANG_TP:-1}"
  IFS=',' read -r -a gpus <<<"${SGLANG_GPUS}"
  ((${#gpus[@]} % tp == 0)) || die "SGLANG_TP=${tp} does not divide the ${#gpus[@]} SGLANG_GPUS"
  log_dir="${LOG_DIR:-logs}"
  run mkdir -p "${log_dir}"
  if [[ "${JAX_NUM_PROCESSES:-1}" -gt 1 ]]; then
    bind="${SGLANG_HOST:-0.0.0.0}"
  else
    bind="${SGLANG_HOST:-127.0.0.1}"
  fi
  case "${bind}" in
    127.*|localhost) host="127.0.0.1" ;;
    *)
      [[ -n "${ROLLOUT_API_KEY:-}" ]] \
        || die "servers listening on ${bind} (beyond loopback) need ROLLOUT_API_KEY"
      host="$(hostname)"
      ;;
  esac
  for ((i = 0; i < ${#gpus[@]} / tp; i++)); do
    group="$(IFS=','; echo "${gpus[*]:i*tp:tp}")"
    port=$(( ${SGLANG_PORT:-30000} + i ))
    if [[ "${DRY_RUN:-0}" == "1" ]]; then
      run env CUDA_VISIBLE_DEVICES="${group}" TP_SIZE="${tp}" HOST="${bind}" launch/sglang_server.sh \
        "${SGLANG_MODEL}" "${port}"
    else
      CUDA_VISIBLE_DEVICES="${group}" TP_SIZE="${tp}" HOST="${bind}" launch/sglang_server.sh \
        "${SGLANG_MODEL}" "${port}" >"${log_dir}/sglang_${port}.log" 2>&1 &
      server_pids+=("$!")
    fi
    local_urls+=("http://${host}:${port}")
  done
fi
urls="${SGLANG_URLS:-$(IFS=','; echo "${local_urls[*]}")}"

# --- the learner ---------------------------------------------------------------------
if [[ -n "${LEARNER_GPUS:-}" ]]; then
  [[ "${LEARNER_GPUS}" =~ ${gpu_list} ]] || die "LEARNER_GPUS must look like 0,1,2,3, got '${LEARNER_GPUS}'"
  export CUDA_VISIBLE_DEVICES="${LEARNER_GPUS}"
fi
# JAX preallocates 75% of each GPU by default; a dedicated learner can take more.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.90}"
if [[ -n "${JAX_COORDINATOR_ADDRESS:-}" ]]; then
  export JAX_PROCESS_ID="${JAX_PROCESS_ID:-${SLURM_PROCID:-}}"
  [[ -n "${JAX_PROCESS_ID}" && -n "${JAX_NUM_PROCESSES:-}" ]] \
    || die "JAX_COORDINATOR_ADDRESS needs JAX_NUM_PROCESSES and JAX_PROCESS_ID (or SLURM_PROCID)"
  echo "gpu_node.sh: process ${JAX_PROCESS_ID} of ${JAX_NUM_PROCESSES}," \
    "coordinator ${JAX_COORDINATOR_ADDRESS}" >&2
fi

rollout_flags=()
if [[ -n "${urls}" ]]; then
  command -v curl >/dev/null || [[ "${DRY_RUN:-0}" == "1" ]] || die "curl is needed to check the SGLang servers"
  IFS=',' read -r -a url_list <<<"${urls}"
  for url in "${url_list[@]}"; do
    [[ "${url}" =~ ^https?:// ]] || die "SGLANG_URLS entries must start with http:// or https://, got '${url}'"
    wait_for_server "${url}"
  done
  weights_dir="${SGLANG_WEIGHTS_DIR:-${TMPDIR:-/tmp}/orchestra_jax_weights}"
  run mkdir -p "${weights_dir}"
  rollout_flags=(--config.rollout.engine=sglang "--config.rollout.urls=${urls}"
                 "--config.rollout.weights_dir=${weights_dir}")
else
  rollout_flags=(--config.rollout.engine=jax)
fi

echo "gpu_node.sh: learner on CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-<all>}" >&2
# Rollout flags last: ml_collections applies --config.a.b overrides after --config loads.
run python3 -m "${module}" "$@" "${rollout_flags[@]}"
