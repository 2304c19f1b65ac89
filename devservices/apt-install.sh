#!/usr/bin/env bash
# The one way this project installs Debian packages on the machine it runs on
# (the test harness, the demos, the base-image build, the Docker engine).
#
#     devservices/apt-install.sh [--missing-only] [APT-OPTIONS...] PACKAGE...
#
# - Installs take turns: every caller takes the same lock file (flock), so test
#   workers, a demo and an image build side by side never meet each other, and
#   apt-get waits for dpkg's own lock (DPkg::Lock::Timeout) when something else
#   on the machine (unattended-upgrades, a person) holds it.
# - No daemon starts: a policy-rc.d that refuses every service start is in place
#   for the length of the install (Debian's mechanism for exactly this), so
#   slapd, smbd or a PostgreSQL cluster never take the ports the tests use.
# - A fresh machine may have no package lists: on a failed install, `apt-get
#   update` runs once and the install is retried.
# --missing-only installs only the packages dpkg does not list as installed.
set -euo pipefail

LOCK=${GPUHUB_APT_LOCK:-/var/lib/apt/gpuhub-harness.lock}
POLICY=/usr/sbin/policy-rc.d
WAIT_S=${GPUHUB_APT_WAIT_S:-600}

say() { echo "apt-install: $*" >&2; }

missing_only=0
options=()
packages=()
while [ $# -gt 0 ]; do
    case $1 in
        --missing-only) missing_only=1 ;;
        -o) options+=("$1" "$2"); shift ;;
        -*) options+=("$1") ;;
        *) packages+=("$1") ;;
    esac
    shift
done
[ ${#packages[@]} -gt 0 ] || { say "no packages named"; exit 2; }

installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}
if [ "$missing_only" = 1 ]; then
    wanted=()
    for p in "${packages[@]}"; do installed "$p" || wanted+=("$p"); done
    [ ${#wanted[@]} -gt 0 ] || exit 0
    packages=("${wanted[@]}")
fi

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    say "needs Debian packages ${packages[*]} (run as root on Debian/Ubuntu, or install them)"
    exit 1
fi

exec 9>"$LOCK"
flock 9

own_policy=0
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\n# gpuhub apt-install: no daemons during install\nexit 101\n' >"$POLICY"
    chmod 755 "$POLICY"
    own_policy=1
fi
log=$(mktemp)
cleanup() { [ "$own_policy" = 1 ] && rm -f "$POLICY"; rm -f "$log"; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
apt_opts=(-y -qq -o "DPkg::Lock::Timeout=$WAIT_S" "${options[@]}")
say "installing ${packages[*]}"
if ! apt-get install "${apt_opts[@]}" "${packages[@]}" >"$log" 2>&1; then
    apt-get update -qq -o "DPkg::Lock::Timeout=$WAIT_S" >>"$log" 2>&1 || true
    if ! apt-get install "${apt_opts[@]}" "${packages[@]}" >"$log" 2>&1; then
        say "apt-get install ${packages[*]} failed:"
        tail -n 30 "$log" >&2
        exit 1
    fi
fi
