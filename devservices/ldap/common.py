"""What a started test directory looks like to tests, `make demo` and hub configs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import seed


@dataclass
class Directory:
    """A running directory on 127.0.0.1 and the data it was seeded with."""

    kind: str  # "openldap" or "active_directory"
    host: str
    port: int  # plain LDAP / StartTLS
    ldaps_port: int  # LDAP over TLS from the first byte
    ca_file: str  # CA that signed the server's certificate
    base_dn: str
    user_base: str
    group_base: str
    bind_dn: str  # read-only service account the hub looks users up with
    bind_password: str
    # Name in the server certificate, when it is not `host` (Samba's generated
    # certificate names the DC, not 127.0.0.1).
    tls_server_name: str | None = None
    users: dict[str, seed.SeedUser] = field(default_factory=dict)
    groups: dict[str, seed.SeedGroup] = field(default_factory=dict)
    allowed_group: str = seed.ALLOWED_GROUP
    admin_group: str = seed.ADMIN_GROUP
    pid: int | None = None
    log_file: str | None = None

    @property
    def url(self) -> str:
        return f"ldap://{self.host}:{self.port}"

    @property
    def ldaps_url(self) -> str:
        return f"ldaps://{self.host}:{self.ldaps_port}"

    def groups_of(self, user: str) -> set[str]:
        """The user's groups, nested membership included, as seeded."""
        return seed.groups_of(user, self.kind)

    def settings_env(self, password_file: str | None = None, allowed_groups: str | None = None,
                     admin_groups: str | None = None) -> dict[str, str]:
        """The GPUHUB_DIRECTORY_* settings a production hub would get for this directory
        (StartTLS; the service account's password from `password_file` when given)."""
        env = {
            "GPUHUB_AUTHENTICATOR": "ldap",
            "GPUHUB_DIRECTORY": self.kind,
            "GPUHUB_DIRECTORY_SERVER": self.host,
            "GPUHUB_DIRECTORY_PORT": str(self.port),
            "GPUHUB_DIRECTORY_TLS": "starttls",
            "GPUHUB_DIRECTORY_CA_FILE": self.ca_file,
            "GPUHUB_DIRECTORY_TLS_SERVER_NAME": self.tls_server_name or "",
            "GPUHUB_DIRECTORY_BIND_DN": self.bind_dn,
            "GPUHUB_DIRECTORY_USER_BASE": self.user_base,
            "GPUHUB_DIRECTORY_GROUP_BASE": self.group_base,
            "GPUHUB_DIRECTORY_ALLOWED_GROUPS": allowed_groups or self.allowed_group,
            "GPUHUB_DIRECTORY_ADMIN_GROUPS": admin_groups or self.admin_group,
        }
        if password_file:
            env["GPUHUB_DIRECTORY_BIND_PASSWORD_FILE"] = str(password_file)
        else:
            env["GPUHUB_DIRECTORY_BIND_PASSWORD"] = self.bind_password
        return env

    def authenticator_config(self, tls: str = "starttls", **overrides) -> dict:
        """Traits for spawner.auth.DirectoryAuthenticator that log in against this directory.

        `tls` is "starttls", "ldaps" or "plain" (the last also sets allow_plaintext).
        """
        cfg: dict = {
            "directory": self.kind,
            "server_address": self.host,
            "lookup_dn": True,
            "user_search_base": self.user_base,
            "group_search_base": self.group_base,
            "lookup_dn_search_user": self.bind_dn,
            "lookup_dn_search_password": self.bind_password,
            "tls_ca_file": self.ca_file,
            "allowed_groups": [self.allowed_group],
            "admin_groups": [self.admin_group],
            "connect_timeout": 5.0,
            "read_timeout": 10,
        }
        if self.tls_server_name:
            cfg["tls_kwargs"] = {"valid_names": [self.tls_server_name]}
        if tls == "ldaps":
            cfg.update(tls_strategy="on_connect", server_port=self.ldaps_port)
        elif tls == "starttls":
            cfg.update(tls_strategy="before_bind", server_port=self.port)
        elif tls == "plain":
            cfg.update(tls_strategy="insecure", server_port=self.port, allow_plaintext=True)
            cfg.pop("tls_ca_file")
        else:
            raise ValueError(f"tls must be starttls, ldaps or plain, not {tls!r}")
        cfg.update(overrides)
        return cfg

    def config_py(self, tls: str = "starttls", authenticator_class: str = "gpu-directory",
                  **overrides) -> str:
        """The same settings as jupyterhub_config.py lines (c.DirectoryAuthenticator...)."""
        lines = [f"c.JupyterHub.authenticator_class = {authenticator_class!r}"]
        for key, value in self.authenticator_config(tls, **overrides).items():
            lines.append(f"c.DirectoryAuthenticator.{key} = {value!r}")
        return "\n".join(lines) + "\n"


class PortBusy(RuntimeError):
    """A port the directory must listen on is taken by another process."""


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float, host: str = "127.0.0.1") -> None:
    """Wait until something accepts on host:port, or fail if `proc` died first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listened on {host}:{port} within {timeout:.0f} s")


def stop_process(proc: subprocess.Popen, timeout: float = 15) -> None:
    """Stop a process this harness started, by its pid: TERM, then KILL."""
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout)


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]  # devservices/ldap/common.py -> the repository


class DirectoryServer:
    """A directory server process this harness started (`start()` sets `proc`)."""

    proc = None

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None


def serve_from_command_line(server, config_out: Path | None, tls: str, name: str) -> int:
    """Start a directory `server`, write its hub settings to `config_out` (if given), say where
    it listens, and serve until Ctrl-C or TERM: what `python -m devservices.ldap.KIND` does."""
    directory = server.start()
    if config_out:
        config_out.parent.mkdir(parents=True, exist_ok=True)
        config_out.write_text(directory.config_py(tls=tls))
        config_out.chmod(0o600)  # it holds the service account's password
    print(f"{name} on {directory.url} (StartTLS) and {directory.ldaps_url}, pid {directory.pid}")
    print(f"users: {', '.join(directory.users)}; passwords are in devservices/ldap/seed.py")
    return serve_until_interrupted(server)


def serve_until_interrupted(server) -> int:
    """Run a started directory `server` until Ctrl-C or TERM (from `make demo`), then stop it."""
    sys.stdout.flush()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: signal.default_int_handler(signal.SIGINT, None))
    try:
        server.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0
