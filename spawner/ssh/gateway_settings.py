"""The SSH gateway's settings: `c.SSHGateway` in the hub's config (port, host keys, limits).

The hub hands them to the gpu-ssh service in a file written from its final config (as the
pool service's limits), with the settings of the hub's authenticator, so the gateway
checks passwords by exactly the hub's rules.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from traitlets import Float, Int, TraitError, Unicode, validate
from traitlets.config import Configurable

FILE_ENV_NAME = "GPUHUB_SSH_SETTINGS_FILE"
# The service's variable carrying the directory's lookup password when the hub got it inline
# (GPUHUB_DIRECTORY_BIND_PASSWORD): the process's environment, never a file.
INLINE_SECRET_ENV = "GPUHUB_SSH_DIRECTORY_BIND_PASSWORD"
# The authenticator's options that hold a secret: never written into the hand-over file.
SECRET_OPTIONS = ("lookup_dn_search_password",)
SECRET_FILE_NAME = "directory-bind-password"


class SSHGateway(Configurable):
    """SSH into one's own server through the hub (the gpu-ssh service)."""

    address = Unicode(
        "127.0.0.1",
        config=True,
        help="""Address the SSH gateway listens on.  127.0.0.1 (default) reaches it from
        this machine only; set "0.0.0.0" (or one interface's address) for people to connect
        from their own machines.""",
    )

    port = Int(
        2222,
        config=True,
        help="""Port of the SSH gateway: people run `ssh -p PORT name@hub`.  Any free port;
        22 needs the hub's process to be allowed to bind it (it is usually the host's own sshd).""",
    )

    host_key_dir = Unicode(
        "",
        config=True,
        help="""Directory of the gateway's host keys (ssh_host_ed25519_key, ssh_host_rsa_key),
        made on the first start and kept: clients' known_hosts entries stay valid across
        restarts and upgrades.  Back it up with the hub's data.  Empty (default):
        `<GPUHUB_DATA_DIR>/ssh/host_keys`.""",
    )

    max_connections = Int(
        200,
        config=True,
        help="""Most SSH connections the gateway holds at once, for everyone together
        (logged in or still logging in).  One more is closed at once.""",
    )

    max_unauthenticated = Int(
        50,
        config=True,
        help="""Most connections, from all addresses together, that have not logged in yet;
        below `max_connections`, so connections that never log in cannot take the places of
        those that did.  When it is reached, a new connection takes the place of the oldest
        one still logging in from the address (IPv6: the /64) that holds the most, if that
        address holds more than the newcomer's; otherwise the newcomer is closed.""",
    )

    max_unauthenticated_per_source = Int(
        10,
        config=True,
        help="""Most connections from one address that have not logged in yet (IPv6
        addresses counted by their /64, which one host can fill with fresh addresses).
        Bounds what one guesser holds while the gateway slows their attempts down.""",
    )

    max_connections_per_user = Int(
        10,
        config=True,
        help="""Most logged-in SSH connections one person holds at once.  VS Code holds one or
        two per window; one more login is refused with a message naming this limit.""",
    )

    max_channels_per_connection = Int(
        32,
        config=True,
        help="""Most channels (shells, commands, SFTP, port forwards) open at once on one
        connection.  One more is refused with a message naming this limit.""",
    )

    login_timeout = Float(
        60.0,
        config=True,
        help="""Seconds a connection may take to log in before it is closed.""",
    )

    max_auth_attempts = Int(
        3,
        config=True,
        help="""Failed passwords or keys one connection may try before it is closed (OpenSSH's
        MaxAuthTries counts the same way).""",
    )

    idle_timeout = Float(
        4 * 3600.0,
        config=True,
        help="""Seconds a connection may pass without a byte in either direction before the
        gateway closes it (with a message).  While a connection is open and within this
        bound, it keeps the person's server from being culled as idle.  0: no bound.""",
    )

    max_connection_seconds = Float(
        24 * 3600.0,
        config=True,
        help="""Longest an SSH connection may stay open, in seconds, however busy; then it is
        closed with a message and the person reconnects.  0: no bound.""",
    )

    activity_interval = Float(
        60.0,
        config=True,
        help="""Seconds between the gateway's reports of SSH activity to the hub
        (`POST /hub/api/users/NAME/activity`), for each person with an open session.  Keep it
        well under the culler's timeout.""",
    )

    start_timeout = Float(
        600.0,
        config=True,
        help="""Seconds the gateway waits for a server it started (a queued GPU spawn included)
        before it tells the person to try again later.""",
    )

    free_failures = Int(
        3,
        config=True,
        help="""Failed logins from one address (IPv6: one /64), or for one account (by the
        authenticator's normalised name, without a domain), before the gateway starts slowing
        down further attempts from it (or for it): the attempt after the third failure waits.""",
    )

    failure_delay = Float(
        0.5,
        config=True,
        help="""Seconds the first slowed attempt waits; each further failure doubles it, up to
        `max_failure_delay`.  The count fades by one every `failure_window` seconds without a
        failure.  A correct login is slowed too (but succeeds), so guessing stays slow and the
        real owner still gets in.""",
    )

    max_failure_delay = Float(
        30.0,
        config=True,
        help="""Longest one attempt is slowed down, in seconds.""",
    )

    failure_window = Float(
        300.0,
        config=True,
        help="""Seconds after which one remembered failure (of an address or account) is forgotten.""",
    )

    tracked_failures = Int(
        10000,
        config=True,
        help="""Addresses and accounts whose failures the gateway remembers at most; the ones
        longest without a failure are forgotten first (bounded memory under a spray attack).""",
    )

    max_keys_per_user = Int(
        10,
        config=True,
        help="""Most public keys one person may register for SSH on the service's page.""",
    )

    max_key_bytes = Int(
        16384,
        config=True,
        help="""Longest public key line accepted when registering a key, in bytes (an RSA key of
        16384 bits is about 2.8 KB).""",
    )

    min_rsa_bits = Int(
        2048,
        config=True,
        help="""Smallest RSA key accepted when registering a key.""",
    )

    hub_timeout = Float(
        20.0,
        config=True,
        help="""Seconds the gateway waits for one answer of the hub's API or of a directory
        check before it refuses the login (or the session) with a message saying so.""",
    )

    @validate("port")
    def _check_port(self, proposal):
        if not 1 <= proposal.value <= 65535:
            raise TraitError("SSHGateway.port must be between 1 and 65535")
        return proposal.value

    @validate("max_connections", "max_unauthenticated", "max_unauthenticated_per_source", "max_connections_per_user",
              "max_channels_per_connection", "max_auth_attempts", "tracked_failures", "max_keys_per_user",
              "max_key_bytes", "min_rsa_bits")
    def _check_count(self, proposal):
        if proposal.value < 1:
            raise TraitError(f"SSHGateway.{proposal.trait.name} must be >= 1")
        return proposal.value

    @validate("login_timeout", "activity_interval", "start_timeout", "failure_delay", "max_failure_delay",
              "failure_window", "hub_timeout")
    def _check_positive(self, proposal):
        if not proposal.value > 0:
            raise TraitError(f"SSHGateway.{proposal.trait.name} must be > 0")
        return proposal.value

    @validate("idle_timeout", "max_connection_seconds", "free_failures")
    def _check_not_negative(self, proposal):
        if proposal.value < 0:
            raise TraitError(f"SSHGateway.{proposal.trait.name} must be >= 0 (0: no bound)")
        return proposal.value

    def values(self) -> dict:
        if self.max_unauthenticated >= self.max_connections:
            raise TraitError(f"SSHGateway.max_unauthenticated ({self.max_unauthenticated}) must be below "
                             f"SSHGateway.max_connections ({self.max_connections}): connections that have "
                             "not logged in would otherwise fill every place")
        return {name: getattr(self, name) for name in self.trait_names(config=True)}


def _jsonable(value):
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(value, key=str) if isinstance(value, (set, frozenset)) else list(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def authenticator_sections(hub) -> dict:
    """{section: {option: value}} of the hub's config for its authenticator's classes: what the
    service needs to build the same authenticator.  Options that are not JSON (a callable hook)
    are left out; the service's authenticator then has that option's default."""
    classes = [cls.__name__ for cls in hub.authenticator_class.mro() if issubclass(cls, Configurable)]
    out: dict = {}
    for name in classes:
        if name in hub.config:
            section = {}
            for key, value in hub.config[name].items():
                try:
                    json.dumps(value, default=_jsonable)
                except (TypeError, ValueError):
                    continue
                section[key] = value
            out[name] = section
    return out


def _secret_sources(hub, sections: dict, state_dir: Path, directory, reader: str = "The SSH gateway") -> dict:
    """Take the secret options out of `sections`; {"Section.option": {"file": path} or
    {"env": name}}: where the service reads each instead.  The directory's lookup password
    given as GPUHUB_DIRECTORY_BIND_PASSWORD_FILE: that file; given inline: the service's own
    variable (INLINE_SECRET_ENV); set in a config file: a file of its own next to the hand-over,
    readable by the hub's user only (the hub's log says to use the _FILE setting instead)."""
    sources: dict = {}
    for section, options in sections.items():
        for option in SECRET_OPTIONS:
            value = options.pop(option, None)
            if not value:
                continue
            key = f"{section}.{option}"
            if directory is not None and value == directory.bind_password and directory.bind_password_file:
                sources[key] = {"file": directory.bind_password_file}
            elif directory is not None and value == directory.bind_password:
                sources[key] = {"env": INLINE_SECRET_ENV}
            else:
                path = state_dir / f"{SECRET_FILE_NAME}.{section}"
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(str(value))
                os.chmod(path, 0o600)
                hub.log.warning("%s is set in a config file: %s reads it from %s. Give it as "
                                "GPUHUB_DIRECTORY_BIND_PASSWORD_FILE instead to keep it out of the hub's data.",
                                key, reader, path)
                sources[key] = {"file": str(path)}
    return sources


def authenticator_hand_over(hub, state_dir: Path, directory=None, reader: str = "The SSH gateway") -> dict:
    """What a service needs to build the hub's authenticator: its class and settings, its
    secrets only as where to read them (_secret_sources; `reader` names the service in the
    hub's warning)."""
    cls = hub.authenticator_class  # the class only: the hub makes its instance later
    sections = authenticator_sections(hub)
    secrets = _secret_sources(hub, sections, state_dir, directory, reader)
    return {
        "authenticator_class": f"{cls.__module__}.{cls.__qualname__}",
        "authenticator_config": sections,
        "authenticator_secrets": secrets,
    }


def render_hand_over(hub, state_dir: Path, directory=None) -> str:
    """The file the service reads: the gateway's settings, the authenticator's class and
    settings (authenticator_hand_over), the hub's roles as far as they reach servers
    (server_access.rules_from_roles)."""
    from .server_access import rules_from_roles

    gateway = SSHGateway(config=hub.config).values()
    if not gateway["host_key_dir"]:
        gateway["host_key_dir"] = str(state_dir / "host_keys")
    return json.dumps({
        "gateway": gateway,
        "state_dir": str(state_dir),
        **authenticator_hand_over(hub, state_dir, directory),
        "server_access": rules_from_roles(hub.load_roles),
    }, default=_jsonable)


def read_secrets(sources: dict, environ=os.environ) -> dict:
    """{section: {option: value}} of the secrets `sources` (_secret_sources) names, read now."""
    out: dict = {}
    for key, source in sources.items():
        section, _, option = key.rpartition(".")
        if "file" in source:
            value = Path(source["file"]).read_text().removesuffix("\n").removesuffix("\r")
        else:
            value = environ.get(source["env"], "")
        out.setdefault(section, {})[option] = value
    return out


def read_hand_over(environ=os.environ) -> dict:
    path = environ.get(FILE_ENV_NAME)
    if not path:
        raise RuntimeError(f"{FILE_ENV_NAME} is not set: the gpu-ssh service runs as a hub service")
    return json.loads(Path(path).read_text())
