#!/bin/sh
# Entry point of the notebook images (runs under tini as PID 1).
# The home directory is a per-user volume; on first start it is empty, so copy
# the starter files in without ever overwriting what the user already has.
set -e
if [ -d /opt/gpuhub/skel ] && [ -w "${HOME:-/home/jovyan}" ]; then
    cp -rn /opt/gpuhub/skel/. "${HOME:-/home/jovyan}/" 2>/dev/null || true
fi
# SSH into this server through the hub's gateway (docs/users/ssh.md): only when the
# spawner handed over this server's keys.  The keys leave the environment of everything
# else the container runs.
if [ -n "${GPUHUB_SSH_AUTHORIZED_KEY:-}" ] && [ -x /usr/local/bin/start-sshd.sh ]; then
    /usr/local/bin/start-sshd.sh || echo "start-notebook: sshd did not start; SSH into this server will fail" >&2
fi
unset GPUHUB_SSH_AUTHORIZED_KEY GPUHUB_SSH_HOST_KEY
exec "$@"
