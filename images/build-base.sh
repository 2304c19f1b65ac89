#!/usr/bin/env bash
# Build the local Debian base image from Debian's own packages, for hosts that
# cannot pull from a registry.  debootstrap of the host's release, with the
# mirror read from the host's apt sources, then `docker import`.
#
# Prints the image reference on stdout.  Rebuilds only when its inputs (this
# script, the release, the package list) change: the tag is their hash.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
PACKAGES=${BASE_PACKAGES:-python3,python3-venv,tini,ca-certificates,libgomp1}
REPO=${BASE_REPO:-gpuhub/debian-base}

say() { echo "build-base: $*" >&2; }

# The host's release and mirror, from its own apt configuration.
. /etc/os-release
SUITE=${VERSION_CODENAME:?cannot read the release codename from /etc/os-release}
mirror_from_host() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        # deb822: the first URIs line of a stanza whose Suites has the plain suite
        awk -v suite="$SUITE" '
            /^URIs:/ {uri=$2}
            /^Suites:/ {for (i=2;i<=NF;i++) if ($i==suite) {print uri; exit}}
        ' "$f"
    done
    if [ -f /etc/apt/sources.list ]; then
        awk -v suite="$SUITE" '$1=="deb" && $0 !~ /\[/ && $3==suite {print $2; exit}
                               $1=="deb" && $0 ~ /\[/ {for (i=1;i<=NF;i++) if ($i==suite) {print $(i-1); exit}}' /etc/apt/sources.list
    fi
}
MIRROR=${BASE_MIRROR:-$(mirror_from_host | head -n1)}
[ -n "$MIRROR" ] || { say "cannot find a mirror for '$SUITE' in the host's apt sources; set BASE_MIRROR"; exit 1; }

HASH=$( { cat "$0"; echo "$SUITE $PACKAGES $(uname -m)"; } | sha256sum | cut -c1-12)
IMAGE="$REPO:$SUITE-$HASH"

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    say "$IMAGE is up to date"
    echo "$IMAGE"
    exit 0
fi

if ! command -v debootstrap >/dev/null; then
    # The project's one installer: it takes turns with every other install and
    # waits for dpkg's lock instead of failing on it.
    say "installing debootstrap"
    bash "$HERE/../devservices/apt-install.sh" debootstrap >&2
fi

ROOTFS=$(mktemp -d /var/tmp/gpuhub-rootfs.XXXXXX)
trap 'rm -rf "$ROOTFS"' EXIT
say "debootstrap $SUITE from the host's mirror (a few minutes)"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 || {
    tail -n 30 "$ROOTFS.log" >&2; exit 1; }
rm -f "$ROOTFS.log"
# Keep the image small and free of the host's traces.
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* \
       "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/*

say "docker import -> $IMAGE"
tar -C "$ROOTFS" -c . | docker import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    --message "Debian $SUITE base built by gpuhub build-base.sh (inputs $HASH)" \
    - "$IMAGE" >/dev/null
docker tag "$IMAGE" "$REPO:latest"
echo "$IMAGE"
