#!/bin/sh
# Entry point of the notebook images (runs under tini as PID 1).
# The home directory is a per-user volume; on first start it is empty, so copy
# the starter files in without ever overwriting what the user already has.
set -e
if [ -d /opt/gpuhub/skel ] && [ -w "${HOME:-/home/jovyan}" ]; then
    cp -rn /opt/gpuhub/skel/. "${HOME:-/home/jovyan}/" 2>/dev/null || true
fi
exec "$@"
