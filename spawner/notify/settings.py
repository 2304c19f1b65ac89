"""The e-mail channel's options, read by the gpu-pool service (from the hub's config file)."""

from __future__ import annotations

from traitlets import Bool, CaselessStrEnum, Float, Int, TraitError, Unicode, validate
from traitlets.config import Configurable


class EmailNotifications(Configurable):
    """E-mail to users about their GPUs and jobs (the events of spawner/notify/).  Set in
    jupyterhub_config.py as `c.EmailNotifications.<option>`; the hub passes the section to the
    gpu-pool service, which sends the mails."""

    enabled = Bool(False, config=True, help="""
        Send notification e-mails.  Off by default: a hub sends no mail until an admin names an
        SMTP server here (`smtp_host`) and turns this on.  Events are still recorded in the
        ledger's outbox while it is off, and expire after `max_age`.
        """)
    smtp_host = Unicode("", config=True, help="""
        The SMTP server that relays the mails (your organisation's mail relay), as a host name or
        address.  Required when `enabled` is True.
        """)
    smtp_port = Int(587, config=True, help="""
        The SMTP server's port: 587 (submission, with `security` "starttls") is usual; 465 with
        "tls"; 25 for a relay inside your network.
        """)
    security = CaselessStrEnum(["starttls", "tls", "none"], "starttls", config=True, help="""
        How the connection to the SMTP server is protected: "starttls" (connect in plain text,
        then upgrade with STARTTLS, and refuse a server that does not offer it), "tls" (TLS from
        the first byte, e.g. port 465) or "none" (a relay on this machine or a trusted network
        only: credentials are then refused, so no password travels in clear).
        """)
    verify_certificate = Bool(True, config=True, help="""
        Check the SMTP server's TLS certificate against the system's CA bundle (or `ca_file`).
        Turn off only for a relay with a self-signed certificate on a trusted network.
        """)
    ca_file = Unicode("", config=True, help="A PEM file of CA certificates to check the SMTP server's against (empty: the system's).")
    username = Unicode("", config=True, help="The account to log in to the SMTP server with (empty: no login).")
    password_file = Unicode("", config=True, help="""
        A file holding the SMTP account's password (its first line), e.g. a Docker secret
        (`/run/secrets/smtp_password`), read at each connection.  The password is never
        written to a log or to the gpu-pool service's settings file.
        """)
    from_address = Unicode("", config=True, help="""
        The mails' sender, e.g. `GPU hub <gpu-hub@example.org>`.  Required when `enabled` is True.
        """)
    public_url = Unicode("", config=True, help="""
        The hub's address as users reach it (`https://hub.example.org`), for the links in the
        mails (the server, the job's log, unsubscribe).  Empty: the hub's own bind address,
        which suits only a hub users reach on that address.
        """)
    timeout = Float(10.0, config=True, help="""
        Seconds one SMTP step (connect, TLS, each command) may take.  A dead SMTP server delays
        only the mails: they are sent from their own threads, never from the service's loop.
        """)
    max_attempts = Int(6, config=True, help="""
        Tries per mail before it is given up (state `failed` in the outbox).  A try counts only
        when the server took none of the message; one that may have reached it is never repeated.
        """)
    retry_delay = Float(30.0, config=True, help="""
        Seconds before the first retry of a mail the server could not take; each further retry
        waits twice as long as the one before (at most an hour).
        """)
    max_age = Float(12 * 3600.0, config=True, help="""
        Seconds an event may wait in the outbox (for retries, the rate limit, a service that was
        down) before it is dropped as too old to tell (state `expired`).
        """)
    mails_per_hour = Int(6, config=True, help="""
        The most mails one user gets in any hour.  Events beyond it wait and then go together as
        one digest, so a flood of ended jobs yields a few mails, not hundreds.
        """)
    poll_interval = Float(1.0, config=True, help="Seconds between the sender's looks at the outbox for due events.")
    stuck_after = Float(600.0, config=True, help="""
        Seconds after which a mail claimed by a sender that stopped (a crash) is settled: given
        back if the sender had not begun to send it, else marked `unknown` and never resent
        (each event is sent at most once).
        """)

    @validate("smtp_port")
    def _check_port(self, proposal):
        if not 0 < proposal["value"] < 65536:
            raise TraitError(f"smtp_port must be a TCP port (1-65535), not {proposal['value']}")
        return proposal["value"]

    @validate("timeout", "retry_delay", "max_age", "poll_interval", "stuck_after")
    def _check_seconds(self, proposal):
        if not proposal["value"] > 0:
            raise TraitError(f"{proposal['trait'].name} must be a number of seconds > 0, not {proposal['value']}")
        return proposal["value"]

    @validate("max_attempts", "mails_per_hour")
    def _check_count(self, proposal):
        if proposal["value"] < 1:
            raise TraitError(f"{proposal['trait'].name} must be at least 1, not {proposal['value']}")
        return proposal["value"]

    def problems(self) -> list[str]:
        """What stops sending with these settings (empty: ready, or not enabled)."""
        if not self.enabled:
            return []
        out = []
        if not self.smtp_host:
            out.append("EmailNotifications.smtp_host is empty")
        if not self.from_address:
            out.append("EmailNotifications.from_address is empty")
        if self.security == "none" and self.username:
            out.append('EmailNotifications.security is "none": a login would send the password in clear')
        return out

    def password(self) -> str | None:
        """The SMTP password from `password_file` (None without one)."""
        if not self.password_file:
            return None
        with open(self.password_file, encoding="utf-8") as f:
            return f.readline().rstrip("\r\n")
