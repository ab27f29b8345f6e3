#!/usr/bin/env bash
# Start one SGLang rollout server for orchestra_jax (GPU host).
#
#   launch/sglang_server.sh MODEL_DIR [PORT]
#
# MODEL_DIR: an HF folder (config.json + safetensors + tokenizer), e.g. one written
# by save_hf_checkpoint. Flags and the pinned version: third_party/sglang/README.md.
# Override with environment variables: HOST (default 127.0.0.1), ROLLOUT_API_KEY,
# TP_SIZE, DP_SIZE, MEM_FRACTION,
# CONTEXT_LENGTH, ATTENTION_BACKEND, SEED, DETERMINISTIC (1/0), PARSERS (1/0),
# SGLANG_PYTHON, LORA_RANK (default 0: no LoRA).
#
# LORA_RANK=r (lora.rank > 0): MODEL_DIR is the base, loaded once; adds
# --enable-lora --max-lora-rank r --lora-target-modules all
# --max-loras-per-batch 2 (the adapter being synced and the one requests in
# flight may still name); each weight sync loads the policy's adapter as
# policy-v<version> (/load_lora_adapter, rollout/http/sglang_client.py).
#
# Access: the server listens on loopback unless HOST names another address.
# ROLLOUT_API_KEY adds --api-key: SGLang then answers only requests with
# `Authorization: Bearer <key>` (all but /health and /metrics), which the
# project's clients send from the variable `rollout.api_key_env` names
# (ROLLOUT_API_KEY by default). /update_weights_from_disk and
# /load_lora_adapter load weights from any path the server can read, so another
# HOST needs ROLLOUT_API_KEY (the script refuses otherwise), and the key is on
# SGLang's command line, visible to this machine's users (`ps`).
#
# CONTEXT_LENGTH must be at least the run's agent.max_context_tokens: the client
# reads it from /v1/models at start-up and refuses a shorter one.
#
# DETERMINISTIC=1 (the default) adds --enable-deterministic-inference: without it
# SGLang ignores every request's sampling_seed, so seeded rollouts (as JaxEngine
# gives them) are not reproducible. Set 0 for throughput when that does not matter.
# PARSERS=1 adds --tool-call-parser qwen25 --reasoning-parser qwen3, so the
# server's /v1/chat/completions returns Qwen3 tool calls and reasoning parsed
# (for an expert model; the policy's /generate is token-out either way).
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 MODEL_DIR [PORT]" >&2
  exit 2
fi
MODEL_DIR="$1"
PORT="${2:-30000}"
if [[ ! -f "${MODEL_DIR}/config.json" ]]; then
  echo "error: ${MODEL_DIR} has no config.json (need an HF model folder)" >&2
  exit 2
fi
if [[ -n "${SGLANG_RETURN_ORIGINAL_LOGPROB:-}" ]]; then
  echo "error: unset SGLANG_RETURN_ORIGINAL_LOGPROB; orchestra_jax expects log_softmax(logits / T)" >&2
  exit 2
fi

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
HOST="${HOST:-127.0.0.1}"
require_key_beyond_loopback "${HOST}" "${ROLLOUT_API_KEY:-}"

PYTHON="${SGLANG_PYTHON:-python}"
args=(
  --model-path "${MODEL_DIR}"
  --host "${HOST}"
  --port "${PORT}"
  --tp-size "${TP_SIZE:-1}"
  --dp-size "${DP_SIZE:-1}"
  --mem-fraction-static "${MEM_FRACTION:-0.8}"
  --context-length "${CONTEXT_LENGTH:-33344}"  # qwen3_8b_project: 24,576 prompt + 8,768 response (qwen3_8b: 24,000 + 8,768)
  --attention-backend "${ATTENTION_BACKEND:-fa3}"
  --random-seed "${SEED:-0}"
)
if [[ -n "${ROLLOUT_API_KEY:-}" ]]; then
  args+=(--api-key "${ROLLOUT_API_KEY}")
fi
if [[ "${DETERMINISTIC:-1}" == "1" ]]; then
  args+=(--enable-deterministic-inference)
else
  echo "note: DETERMINISTIC=0: SGLang ignores sampling_seed (samples are not reproducible)" >&2
fi
if [[ "${LORA_RANK:-0}" != "0" ]]; then
  args+=(--enable-lora --max-lora-rank "${LORA_RANK}" --lora-target-modules all
    --max-loras-per-batch 2)
fi
if [[ "${PARSERS:-0}" == "1" ]]; then
  args+=(--tool-call-parser qwen25 --reasoning-parser qwen3)
fi

shown=()
for arg in "${args[@]}"; do  # the log shows no key
  if [[ -n "${ROLLOUT_API_KEY:-}" && "${arg}" == "${ROLLOUT_API_KEY}" ]]; then arg="***"; fi
  shown+=("${arg}")
done
echo "starting SGLang: ${PYTHON} -m sglang.launch_server ${shown[*]}" >&2
exec "${PYTHON}" -m sglang.launch_server "${args[@]}"
