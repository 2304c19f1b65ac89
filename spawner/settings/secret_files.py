"""Secrets given as files: `NAME_FILE=/run/secrets/...` in place of `NAME=value`.

Docker secrets (the Swarm stack, hub_config/swarm-stack.yml) reach a container as files
under /run/secrets/, never in its environment, where `docker inspect` would show them.  For
each secret setting below, the hub takes its value from the variable or from the file the
`_FILE` variable names (one of the two; both set is an error).  One trailing newline, what
`echo value > file` leaves, is not part of the value.  No message here holds the value.

GPUHUB_DIRECTORY_BIND_PASSWORD_FILE is read where the directory's settings are
(directory.py); the cookie secret is a file JupyterHub reads itself (GPUHUB_COOKIE_SECRET_FILE,
checked here by `private_file`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from .parsing import SettingsError

# The secrets read here: the ledger's URL (it holds the database password) and JupyterHub's
# key for the users' stored auth state.
SECRET_FILE_SETTINGS = ("GPUHUB_POOL_DB_URL", "JUPYTERHUB_CRYPT_KEY")


def read_secret_file(name: str, path: str) -> str:
    """The secret in the file at `path` (named by the variable `name`), one trailing newline dropped."""
    try:
        value = Path(path).read_text().removesuffix("\n").removesuffix("\r")
    except OSError as exc:
        raise SettingsError(f"{name}={path!r} cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SettingsError(f"{name}={path!r} is not text") from None
    if not value.strip():
        raise SettingsError(f"{name}={path!r} is empty")
    return value


def secret_setting(env: Mapping[str, str], name: str) -> str | None:
    """The value of the secret `name` read from the file NAME_FILE names; None when that is unset."""
    path = env.get(f"{name}_FILE", "").strip()
    if not path:
        return None
    if env.get(name, "").strip():
        raise SettingsError(f"{name} and {name}_FILE are both set; set only one (the file is the safer choice)")
    return read_secret_file(f"{name}_FILE", path)


def with_secret_files(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of `env` where each secret given as NAME_FILE is read into NAME (and NAME_FILE dropped)."""
    resolved = dict(env)
    for name in SECRET_FILE_SETTINGS:
        value = secret_setting(env, name)
        if value is not None:
            resolved[name] = value
            del resolved[f"{name}_FILE"]
    return resolved


def private_file(env: Mapping[str, str], name: str) -> str:
    """The absolute path in `name` ("" when unset): a file the hub can read and nobody else
    can (JupyterHub refuses a cookie secret that other users may read)."""
    path = env.get(name, "").strip()
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
    except OSError as exc:
        raise SettingsError(f"{name}={path!r} cannot be read: {exc.strerror}") from None
    if mode & (stat.S_IRWXO):
        raise SettingsError(f"{name}={path!r} can be read by anybody (mode {stat.S_IMODE(mode):04o}): give it "
                            "mode 0400 and the hub's user (a Docker secret: `mode: 0400` and `uid:` in the "
                            "stack file)")
    return str(Path(path).resolve())
