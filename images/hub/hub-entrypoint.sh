#!/bin/sh
# Entrypoint of the hub image.  Started as root (the stack's hub service, `user: root`), it gives
# the unprivileged jupyterhub user the group of the Docker socket mounted into the container (its
# gid differs from host to host, so it cannot be fixed in the image), makes the data volume
# theirs, and runs the command as that user with no capabilities and no new privileges.  Started
# as anyone else (the GPU agent), it runs the command as it is.
#
# Access to the Docker socket is root on the manager whatever the uid: dropping root still keeps
# a bug in the hub from writing the image's or the volume's files as root.
set -eu
socket=${DOCKER_SOCKET:-/var/run/docker.sock}
if [ "$(id -u)" = 0 ]; then
    groups=""
    if [ -S "$socket" ]; then
        groups="--groups=$(stat -c %g "$socket")"
    fi
    data=${GPUHUB_DATA_DIR:-/srv/jupyterhub}
    mkdir -p "$data"
    chown jupyterhub:jupyterhub "$data"
    chmod 0700 "$data"
    export HOME=/srv/jupyterhub
    # shellcheck disable=SC2086 # $groups is one word or none
    exec setpriv --reuid=jupyterhub --regid=jupyterhub ${groups:---clear-groups} \
        --inh-caps=-all --bounding-set=-all --no-new-privs -- "$@"
fi
exec "$@"
