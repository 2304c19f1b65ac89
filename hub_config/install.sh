#!/usr/bin/env bash
# Install GPU JupyterHub on a server, from this clone: the steps that can be
# automated.  `make install` runs it as root; every step is idempotent, so a
# second run (an upgrade: `git pull && make install`) redoes only what changed.
#
#   1. a virtual environment in $PREFIX/venv, made with the system's Python,
#      with this package installed from a wheel built in a temporary directory
#      (the clone is not written to), or the wheel in $WHEEL; and hub_config/
#      copied to $PREFIX/hub_config
#   2. configurable-http-proxy from npm, in $PREFIX/node
#   3. the notebook images (images/build-images.sh with the venv's Python):
#      VARIANTS, by default "mkl cuda" on a host where `nvidia-smi -L` lists a
#      GPU, else "mkl" (and the closing list says how to build the CUDA image)
#   4. $ETC_DIR/gpuhub.env from hub_config/examples/production.env, mode 0600,
#      only if absent: an existing one is never touched
#   5. the data directory $DATA_DIR (mode 0700)
#   6. the systemd unit in $UNIT_DIR; `systemctl daemon-reload` and `enable`
#      when systemd runs (never `start`: the environment file needs a person first)
#
# Options (or the environment variables of the same meaning):
#   --destdir DIR   install under DIR (a staging root: nothing outside it is touched,
#                   systemctl is not run); DESTDIR
#   --prefix DIR    /opt/jupyterhub-gpu; PREFIX
#   --skip-venv     no virtual environment / pip install (SKIP_VENV=1)
#   --skip-proxy    no npm install (SKIP_PROXY=1)
#   --skip-images   no image build (SKIP_IMAGES=1)
# ETC_DIR (/etc/jupyterhub-gpu), DATA_DIR (/var/lib/jupyterhub-gpu), UNIT_DIR
# (/etc/systemd/system), WHEEL (a built wheel instead of this clone), EXTRAS
# (pip extras, "postgres" for a PostgreSQL ledger), PYTHON (the Python the venv
# is made with: /usr/bin/python3 when it exists, else python3 on PATH; one under
# /root, /home or /run/user is refused, since the unit's ProtectHome=yes hides
# those from the hub), VARIANTS (see 3).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DESTDIR=${DESTDIR:-}
PREFIX=${PREFIX:-/opt/jupyterhub-gpu}
ETC_DIR=${ETC_DIR:-/etc/jupyterhub-gpu}
DATA_DIR=${DATA_DIR:-/var/lib/jupyterhub-gpu}
UNIT_DIR=${UNIT_DIR:-/etc/systemd/system}
PYTHON=${PYTHON:-$( [ -x /usr/bin/python3 ] && echo /usr/bin/python3 || echo python3 )}
WHEEL=${WHEEL:-}
EXTRAS=${EXTRAS:-}
SKIP_VENV=${SKIP_VENV:-0}
SKIP_PROXY=${SKIP_PROXY:-0}
SKIP_IMAGES=${SKIP_IMAGES:-0}

while [ $# -gt 0 ]; do
    case $1 in
        --destdir) DESTDIR=$2; shift 2 ;;
        --prefix) PREFIX=$2; shift 2 ;;
        --skip-venv) SKIP_VENV=1; shift ;;
        --skip-proxy) SKIP_PROXY=1; shift ;;
        --skip-images) SKIP_IMAGES=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

UNIT=jupyterhub-gpu.service
ENV_FILE=$ETC_DIR/gpuhub.env
say() { echo "install: $*"; }
todo=()

# 1. The virtual environment and the hub's config.
# ProtectHome=yes in the unit makes these invisible to the hub: an interpreter
# there leaves it unable to start ("cannot execute: required file not found").
hidden_from_the_unit() {
    case $1 in /root/*|/home/*|/run/user/*) return 0 ;; *) return 1 ;; esac
}
venv=$DESTDIR$PREFIX/venv
if [ "$SKIP_VENV" = 1 ]; then
    say "virtual environment: skipped"
else
    use_the_system_python() {
        echo "install: $1" >&2
        echo "  Use the system's Python: PYTHON=/usr/bin/python3 make install (Debian: apt-get install python3-venv)" >&2
        exit 1
    }
    if [ -L "$venv/bin/python" ] || [ -e "$venv/bin/python" ]; then
        # An existing venv keeps the interpreter it was made with.
        base=$(readlink -m "$venv/bin/python")
        if hidden_from_the_unit "$base"; then
            use_the_system_python "$venv was made with $base, under a directory the unit's ProtectHome=yes
  hides from the hub, which then cannot start. Remove it (rm -rf $venv) and run the install again."
        fi
    else
        base=$("$PYTHON" -c 'import os, sys; print(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))') ||
            use_the_system_python "cannot run $PYTHON (PYTHON): a Python 3.11 or newer is needed."
        if hidden_from_the_unit "$base"; then
            use_the_system_python "$PYTHON is $base, under a directory the unit's ProtectHome=yes hides
  from the hub, which then cannot start."
        fi
        "$PYTHON" -m venv "$venv"
    fi
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    wheel=$WHEEL
    if [ -z "$wheel" ]; then
        # Built out of tree: the package's sources copied to a temporary directory,
        # so the clone gets no build/ or *.egg-info, and no module deleted since an
        # earlier install survives in a stale build/.
        work=$(mktemp -d "${TMPDIR:-/tmp}/gpuhub-install.XXXXXX")
        trap 'rm -rf "$work"' EXIT
        mkdir "$work/src"
        cp -R "$REPO/pyproject.toml" "$REPO/README.md" "$REPO/spawner" "$work/src/"
        find "$work/src" -name __pycache__ -prune -exec rm -rf {} +
        "$venv/bin/python" -m pip wheel --quiet --no-deps --wheel-dir "$work/dist" "$work/src"
        wheel=$(ls "$work"/dist/*.whl)
    fi
    # The dependencies (and the package when its version changed), then the package
    # itself again: an upgrade of the same version number must still replace it.
    "$venv/bin/python" -m pip install --quiet --upgrade "$wheel${EXTRAS:+[$EXTRAS]}"
    "$venv/bin/python" -m pip install --quiet --force-reinstall --no-deps "$wheel"
    say "virtual environment: $venv, Python $base ($("$venv/bin/jupyterhub" --version 2>/dev/null | tail -1 || echo '?'))"
fi
install -d -m 0755 "$DESTDIR$PREFIX/hub_config"
cp -R "$REPO/hub_config/jupyterhub_config.py" "$REPO/hub_config/examples" "$DESTDIR$PREFIX/hub_config/"
# Where the images are built from: `gpu-pool doctor` prints the command that builds a missing one.
echo "$REPO" > "$DESTDIR$PREFIX/hub_config/clone"
say "hub config: $DESTDIR$PREFIX/hub_config/jupyterhub_config.py"

# 2. configurable-http-proxy.
if [ "$SKIP_PROXY" = 1 ]; then
    say "configurable-http-proxy: skipped"
elif [ -x "$DESTDIR$PREFIX/node/node_modules/.bin/configurable-http-proxy" ]; then
    say "configurable-http-proxy: already in $DESTDIR$PREFIX/node"
else
    command -v npm >/dev/null || { echo "install: npm is missing (Debian: apt-get install npm)" >&2; exit 1; }
    npm install --silent --no-fund --no-audit --prefix "$DESTDIR$PREFIX/node" configurable-http-proxy
    say "configurable-http-proxy: installed in $DESTDIR$PREFIX/node"
fi

# 3. The notebook images: CUDA too where a GPU is (the settings' GPUHUB_GPU_IMAGE).
if [ -z "${VARIANTS:-}" ]; then
    if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
        VARIANTS="mkl cuda"
    else
        VARIANTS=mkl
    fi
fi
if [ "$SKIP_IMAGES" = 1 ]; then
    say "images: skipped"
    todo+=("build the notebook images: PYTHON=$PREFIX/venv/bin/python $REPO/images/build-images.sh $VARIANTS")
else
    [ -x "$venv/bin/python" ] || { echo "install: the images are built with the venv's Python; run" \
                                      "without --skip-venv (or add --skip-images)" >&2; exit 1; }
    # build.py reads the hub's JupyterHub version from the venv; nothing is installed into the clone.
    PYTHON="$venv/bin/python" "$REPO/images/build-images.sh" $VARIANTS
    say "images: $VARIANTS"
fi
case " $VARIANTS " in
    *" cuda "*) ;;
    *) todo+=("the CUDA image (GPUHUB_GPU_IMAGE, for the GPU profiles) is not built: no GPU was found" \
              "  here (nvidia-smi -L); once there is one: PYTHON=$PREFIX/venv/bin/python $REPO/images/build-images.sh cuda") ;;
esac

# 4. The environment file: made once, never overwritten.
install -d -m 0700 "$DESTDIR$ETC_DIR"
if [ -e "$DESTDIR$ENV_FILE" ]; then
    say "settings: $DESTDIR$ENV_FILE exists, left as it is"
else
    (umask 077 && sed "s|^GPUHUB_DATA_DIR=.*|GPUHUB_DATA_DIR=$DATA_DIR|" \
        "$REPO/hub_config/examples/production.env" > "$DESTDIR$ENV_FILE")
    chmod 0600 "$DESTDIR$ENV_FILE"
    say "settings: $DESTDIR$ENV_FILE made from hub_config/examples/production.env"
    todo+=("edit $ENV_FILE: the directory, JUPYTERHUB_CRYPT_KEY (openssl rand -hex 32), HTTPS")
fi

# 5. The data directory.
install -d -m 0700 "$DESTDIR$DATA_DIR"
say "data directory: $DESTDIR$DATA_DIR"

# 6. The systemd unit, with this install's paths.
install -d -m 0755 "$DESTDIR$UNIT_DIR"
sed -e "s|/opt/jupyterhub-gpu|$PREFIX|g" -e "s|/etc/jupyterhub-gpu|$ETC_DIR|g" \
    -e "s|/var/lib/jupyterhub-gpu|$DATA_DIR|g" "$REPO/hub_config/$UNIT" > "$DESTDIR$UNIT_DIR/$UNIT.new"
chmod 0644 "$DESTDIR$UNIT_DIR/$UNIT.new"
mv "$DESTDIR$UNIT_DIR/$UNIT.new" "$DESTDIR$UNIT_DIR/$UNIT"
say "systemd unit: $DESTDIR$UNIT_DIR/$UNIT"
if [ -z "$DESTDIR" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
    systemctl daemon-reload
    systemctl enable "$UNIT"
    say "systemd: $UNIT enabled (not started)"
else
    todo+=("systemd is not running here (or DESTDIR is set): on the server run" \
           "  systemctl daemon-reload && systemctl enable $UNIT")
fi

echo
echo "What a person must still do (README, \"Running in production\"):"
for line in "${todo[@]}"; do echo "  - $line"; done
echo "  - NVIDIA driver, NVIDIA Container Toolkit (>= 1.14) and Docker on this host"
echo "  - check the host, with the hub's settings: $PREFIX/venv/bin/gpu-pool --env-file $ENV_FILE doctor"
echo "  - start: systemctl start $UNIT   (logs: journalctl -u $UNIT)"
