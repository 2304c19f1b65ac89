#!/usr/bin/env bash
# Make sure a Docker engine answers on this machine.
#
# - A daemon that already answers is used as it is; we only report whether it
#   accepts NVIDIA device requests (`--gpus`).
# - Otherwise, as root on Debian/Ubuntu, install Debian's docker.io and start
#   dockerd in the background with a test double of NVIDIA's
#   nvidia-container-runtime-hook on its PATH.  dockerd registers its "nvidia"
#   device driver when that program exists at start, so `--gpus device=...`
#   behaves as on a GPU host: the container gets NVIDIA_VISIBLE_DEVICES.
#
# Idempotent: a second call finds the daemon and returns at once.
set -euo pipefail

STATE_DIR=${GPUHUB_STATE_DIR:-/var/lib/gpuhub-harness}
HOOK_DIR=$STATE_DIR/nvidia-hook-double
LOG=$STATE_DIR/dockerd.log
PIDFILE=$STATE_DIR/dockerd.pid

say() { echo "docker-up: $*" >&2; }

# Does the daemon accept NVIDIA device requests?  It does when it found
# nvidia-container-runtime-hook (real or the test double) on its PATH at start.
report_gpu_requests() {
    local image
    image=$(docker images --format '{{.Repository}}:{{.Tag}}' | grep -m1 '^gpuhub/debian-base:' || true)
    if [ -z "$image" ]; then
        say "NVIDIA device requests: not checked yet (no local image to try them with)"
    elif docker run --rm --network none --gpus '"device=GPU-probe"' --entrypoint /bin/true "$image" >/dev/null 2>&1; then
        say "NVIDIA device requests (--gpus): accepted"
    else
        say "NVIDIA device requests (--gpus): REFUSED; restart dockerd with nvidia-container-runtime-hook on its PATH"
    fi
}

if docker info >/dev/null 2>&1; then
    say "a Docker engine already answers; using it"
    report_gpu_requests
    exit 0
fi

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    say "no Docker engine answers, and this is not root on Debian/Ubuntu: start one and retry"
    exit 1
fi

if ! command -v dockerd >/dev/null; then
    say "installing Debian's docker.io"
    # Without recommends: they would bring AppArmor's tools, which dockerd then
    # tries to use.  The installer keeps the package from starting a service.
    bash "$(dirname "$0")/apt-install.sh" --no-install-recommends docker.io iptables
fi

mkdir -p "$HOOK_DIR"
# The double stands where NVIDIA's hook would: dockerd only needs it to exist
# at start; runc calls it as a prestart hook with the container state on stdin.
cat >"$HOOK_DIR/nvidia-container-runtime-hook" <<'HOOK'
#!/bin/sh
# Test double of nvidia-container-runtime-hook: accept "prestart", drain stdin.
cat >/dev/null
exit 0
HOOK
chmod +x "$HOOK_DIR/nvidia-container-runtime-hook"

if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    say "dockerd (pid $(cat "$PIDFILE")) is starting"
else
    say "starting dockerd (log: $LOG)"
    PATH="$HOOK_DIR:$PATH" nohup dockerd --pidfile "$PIDFILE.dockerd" >"$LOG" 2>&1 &
    echo $! >"$PIDFILE"
fi

for _ in $(seq 1 60); do
    if docker info >/dev/null 2>&1; then
        say "dockerd is up (pid $(cat "$PIDFILE")); NVIDIA device requests handled by the hook double"
        exit 0
    fi
    sleep 1
done
say "dockerd did not answer within 60 s; last log lines:"
tail -n 20 "$LOG" >&2
exit 1
