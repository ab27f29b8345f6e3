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

# Succeeds when HOST is a loopback address (the servers' default).
host_is_loopback() {
  case "$1" in
    127.*|localhost|::1) return 0 ;;
    *) return 1 ;;
  esac
}

# Exits 2 when HOST reaches beyond this machine and KEY is empty: a rollout server
# loads weights on request, so an exposed port needs the key the clients send.
require_key_beyond_loopback() {
  if ! host_is_loopback "$1" && [[ -z "$2" ]]; then
    echo "error: HOST=$1 exposes the server beyond this machine: set ROLLOUT_API_KEY" \
      "(the clients send it), and keep the port on a network only the learner reaches" >&2
    exit 2
  fi
}
