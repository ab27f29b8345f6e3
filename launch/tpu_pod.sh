#!/usr/bin/env bash
# Run the training job on every worker of a Cloud TPU VM (a single host or a pod slice).
#
# Steps, each on all workers at once (gcloud ... --worker=all):
#   1. sync   copy this checkout (tracked and untracked-but-not-ignored files) to ~/$REMOTE_DIR
#   2. install  pip install -e ".[tpu]"
#   3. run    ORCHESTRA_JAX_DISTRIBUTED=1 python3 -m $MODULE <your flags> <rollout flags>
# Every worker runs the same command: JAX is multi-controller, and the entry point
# calls jax.distributed.initialize() when ORCHESTRA_JAX_DISTRIBUTED=1 (see launch/README.md).
# Rollouts: a TPU VM runs no SGLang, so by default each worker plays its share of the
# episodes on the in-process JAX engine (--config.rollout.engine=jax); with SGLANG_URLS,
# the workers share SGLang servers running elsewhere (a GPU cluster), which reload
# weights from SGLANG_WEIGHTS_DIR, a folder both sides mount.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: TPU_NAME=NAME TPU_ZONE=ZONE [TPU_PROJECT=PROJECT] \
         launch/tpu_pod.sh [--no-sync] [--no-install] [--detach] [--] [FLAGS...]

Runs `python3 -m $MODULE FLAGS...` on every worker of the TPU VM NAME.

Options:
  --no-sync      do not copy this checkout to the workers (it is already there)
  --no-install   do not run pip install -e ".[tpu]" on the workers
  --detach       run under nohup, logging to ~/$REMOTE_DIR/logs/<time>.log on each
                 worker, and return at once (survives a dropped ssh connection)
  -h, --help     this message

Environment:
  TPU_NAME, TPU_ZONE   the TPU VM and its zone (required)
  TPU_PROJECT          GCP project (default: gcloud's configured project)
  REMOTE_DIR           checkout folder under the workers' home (default: orchestra_jax)
  MODULE               python module to run (default: experiments.grpo_hle)
  SGLANG_URLS          comma-separated SGLang servers elsewhere; unset = JAX rollouts on the TPUs
  SGLANG_WEIGHTS_DIR   with SGLANG_URLS: a folder the workers write and the servers read
  DRY_RUN=1            print the gcloud commands instead of running them

Example (Qwen3-8B on a v5p-32 slice: 16 chips, 4 workers; the whole workdir on GCS, as
launch/README.md "Workdirs on Google Cloud Storage" says; see
docs/scaling.md and `python -m launch.plan` for the mesh):
  TPU_NAME=orch-v5p-32 TPU_ZONE=us-east5-a launch/tpu_pod.sh -- \
      --config=experiments/configs/grpo_hle.py:qwen3_8b --config.model.hf_path=/mnt/ckpt/Qwen3-8B \
      --config.tokenizer=/mnt/ckpt/Qwen3-8B --config.workdir=gs://my-bucket/runs/8b
EOF
}

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

sync=1 install=1 detach=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --no-sync) sync=0; shift ;;
    --no-install) install=0; shift ;;
    --detach) detach=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) break ;;  # the first unknown argument starts the job's own flags
  esac
done

[[ -n "${TPU_NAME:-}" ]] || { usage >&2; die "set TPU_NAME to the TPU VM's name"; }
[[ -n "${TPU_ZONE:-}" ]] || { usage >&2; die "set TPU_ZONE to the TPU VM's zone"; }
remote_dir="${REMOTE_DIR:-orchestra_jax}"
module="${MODULE:-experiments.grpo_hle}"
gcloud_flags=(--zone="${TPU_ZONE}")
[[ -n "${TPU_PROJECT:-}" ]] && gcloud_flags+=(--project="${TPU_PROJECT}")

on_all_workers() {
  run gcloud compute tpus tpu-vm ssh "${TPU_NAME}" "${gcloud_flags[@]}" --worker=all --command="$1"
}

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
quoted_dir="$(printf '%q' "${remote_dir}")"

if [[ "${sync}" == "1" ]]; then
  command -v git >/dev/null || die "git is needed to list the files to copy (or pass --no-sync)"
  tarball="$(mktemp "${TMPDIR:-/tmp}/orchestra_jax.XXXXXX.tar.gz")"
  trap 'rm -f "${tarball}"' EXIT
  # Only what git would commit: no run folders, caches or virtual environments.
  (cd "${repo_root}" && git ls-files -z --cached --others --exclude-standard \
    | tar --null -T - -czf "${tarball}")
  run gcloud compute tpus tpu-vm scp "${tarball}" "${TPU_NAME}:/tmp/orchestra_jax.tar.gz" \
    "${gcloud_flags[@]}" --worker=all
  on_all_workers "mkdir -p ${quoted_dir} && tar -xzf /tmp/orchestra_jax.tar.gz -C ${quoted_dir}"
fi

if [[ "${install}" == "1" ]]; then
  on_all_workers "cd ${quoted_dir} && python3 -m pip install --quiet --upgrade pip \
&& python3 -m pip install --quiet -e '.[tpu]'"
fi

rollout_flags=(--config.rollout.engine=jax)
if [[ -n "${SGLANG_URLS:-}" ]]; then
  [[ -n "${SGLANG_WEIGHTS_DIR:-}" ]] \
    || die "SGLANG_URLS needs SGLANG_WEIGHTS_DIR, a folder the workers write and the servers read"
  rollout_flags=(--config.rollout.engine=sglang "--config.rollout.urls=${SGLANG_URLS}"
                 "--config.rollout.weights_dir=${SGLANG_WEIGHTS_DIR}")
fi
# Rollout flags last: ml_collections applies --config.a.b overrides after --config loads.
job_flags="$(printf ' %q' "$@" "${rollout_flags[@]}")"
job="ORCHESTRA_JAX_DISTRIBUTED=1 python3 -m $(printf '%q' "${module}")${job_flags}"
if [[ "${detach}" == "1" ]]; then
  log="logs/\$(date -u +%Y%m%dT%H%M%SZ).log"
  on_all_workers "cd ${quoted_dir} && mkdir -p logs && nohup env ${job} > ${log} 2>&1 < /dev/null &"
else
  on_all_workers "cd ${quoted_dir} && ${job}"
fi
