#!/usr/bin/env bash
# Build the local Debian base and the given notebook image variants, and with `hub` the hub
# image (images/build_hub.py: JupyterHub, configurable-http-proxy and this package, for the
# Swarm stack hub_config/swarm-stack.yml), then print their sizes.  What `make images` runs:
#
#     images/build-images.sh mkl hub        # the default of `make images`
#     images/build-images.sh mkl cuda hub   # also the CUDA image (~2.6 GB of wheels)
#     images/build-images.sh mkl            # what a one-host install needs
#
# Each image is tagged by the hash of its inputs, so an unchanged one is found,
# not rebuilt.  Python packages come through the host's own pip settings and
# stay out of the images (see images/Dockerfile).  BASE_IMAGE=... skips the
# local base and builds on that image instead (e.g. debian:bookworm-slim where
# a registry is reachable).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
# build.py reads the hub's JupyterHub version, so it runs in the project's venv.
PYTHON=${PYTHON:-$( [ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3 )}
[ $# -gt 0 ] || set -- mkl

BASE=${BASE_IMAGE:-$("$HERE/build-base.sh")}
refs=("$BASE")
for variant in "$@"; do
    if [ "$variant" = hub ]; then
        refs+=("$("$PYTHON" "$HERE/build_hub.py" --base-image "$BASE")")
    else
        refs+=("$("$PYTHON" "$HERE/build.py" --variant "$variant" --base-image "$BASE")")
    fi
done

printf '\n%-48s %-8s %-6s %s\n' IMAGE TF CUDA SIZE
for ref in "${refs[@]}"; do
    docker image inspect --format \
        '{{.Size}}|{{index .Config.Labels "org.jupyter.gpuhub.tensorflow-version"}}|{{index .Config.Labels "org.jupyter.gpuhub.cuda-version"}}' \
        "$ref" | awk -F'|' -v ref="$ref" '{
            tf = ($2 == "" || $2 ~ /no value/) ? "-" : $2
            cuda = ($3 == "" || $3 ~ /no value/) ? "-" : $3
            printf "%-48s %-8s %-6s %.2f GB\n", ref, tf, cuda, $1 / 1e9 }'
done
