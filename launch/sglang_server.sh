#!/usr/bin/env bash
# Start one SGLang rollout server for orchestra_jax (GPU host).
#
#   launch/sglang_server.sh MODEL_DIR [PORT]
#
# MODEL_DIR: an HF folder (config.json + safetensors + tokenizer), e.g. one written
# by save_hf_checkpoint. Flags and the pinned version: third_party/sglang/README.md.
# Override with environment variables: HOST, TP_SIZE, DP_SIZE, MEM_FRACTION,
# CONTEXT_LENGTH, ATTENTION_BACKEND, SEED, DETERMINISTIC (1/0), PARSERS (1/0),
# SGLANG_PYTHON, LORA_RANK (default 0: no LoRA).
#
# LORA_RANK=r (lora.rank > 0): MODEL_DIR is the base, loaded once; adds
# --enable-lora --max-lora-rank r --lora-target-modules all
# --max-loras-per-batch 2 (the adapter being synced and the one requests in
# flight may still name); each weight sync loads the policy's adapter as
# policy-v<version> (/load_lora_adapter, rollout/sglang_client.py).
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

PYTHON="${SGLANG_PYTHON:-python}"
args=(
  --model-path "${MODEL_DIR}"
  --host "${HOST:-0.0.0.0}"
  --port "${PORT}"
  --tp-size "${TP_SIZE:-1}"
  --dp-size "${DP_SIZE:-1}"
  --mem-fraction-static "${MEM_FRACTION:-0.8}"
  --context-length "${CONTEXT_LENGTH:-33344}"  # qwen3_8b_project: 24,576 prompt + 8,768 response (qwen3_8b: 24,000 + 8,768)
  --attention-backend "${ATTENTION_BACKEND:-fa3}"
  --random-seed "${SEED:-0}"
)
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

echo "starting SGLang: ${PYTHON} -m sglang.launch_server ${args[*]}" >&2
exec "${PYTHON}" -m sglang.launch_server "${args[@]}"
