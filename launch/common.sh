# Shell helpers shared by the launch scripts; source it, don't run it.

die() { echo "$(basename "$0"): error: $*" >&2; exit 2; }

# Runs a command, or only prints it (shell-quoted) when DRY_RUN=1.
run() {
  if [[ "${DRY_RUN:-0}" == "1" ]]; then
    printf '+'; printf ' %q' "$@"; printf '\n'
  else
    "$@"
  fi
}
