"""The channels' options (mail, webhooks, browser) and what is told, read by the gpu-pool service."""

from __future__ import annotations

from traitlets import Bool, CaselessStrEnum, Float, Int, List, TraitError, Unicode, validate
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
    ca_file = Unicode("", config=True, help="A PEM file of CA certificates to check the SMTP server's against "
                                            "(empty: the system's).")
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

    confirm_max_age = Float(24 * 3600.0, config=True, help="""
        Seconds a confirmation link for a user-set address stays valid (the address a user sets
        on the notification choices page gets a mail with a signed link; mail goes to it only
        once the link is opened).  The directory's `mail` attribute needs no confirmation.
        """)
    confirmations_per_hour = Int(3, config=True, help="""
        The most confirmation mails one user may ask for in any hour (each to an address of
        their choosing): more are refused with a 429, so the hub cannot be made to mail strangers.
        """)

    @validate("smtp_port")
    def _check_port(self, proposal):
        if not 0 < proposal["value"] < 65536:
            raise TraitError(f"smtp_port must be a TCP port (1-65535), not {proposal['value']}")
        return proposal["value"]

    @validate("timeout", "retry_delay", "max_age", "poll_interval", "stuck_after", "confirm_max_age")
    def _check_seconds(self, proposal):
        if not proposal["value"] > 0:
            raise TraitError(f"{proposal['trait'].name} must be a number of seconds > 0, not {proposal['value']}")
        return proposal["value"]

    @validate("max_attempts", "mails_per_hour", "confirmations_per_hour")
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


class Notifications(Configurable):
    """What is told, whatever the channel (`c.Notifications.<option>`): when a ready server is
    worth a mail, when a cull warning goes.  The hub passes the section to the gpu-pool service."""

    ready_after = Float(30.0, config=True, help="""
        Seconds a user must have waited in the queue for their server's "ready" notification to
        go by default (the "auto" choice): a shorter wait was most likely watched in the tab.
        A user who chose "always" is told after any wait in the queue; a spawn that never waited
        is never told.
        """)
    cull_warning_before = Float(600.0, config=True, help="""
        Seconds before an idle server's cull that its owner is warned, once per idle spell, with a
        one-click "keep it" link that counts as activity.  0 turns the warnings off.  Only when the
        hub culls (GPUHUB_CULL); the deadline is the culler's own rule (culling/deadline.py).
        """)
    cull_check_every = Float(30.0, config=True, help="""
        Seconds between the gpu-pool service's looks at the servers' cull deadlines (one listing
        of the hub's active servers each time).  A warning goes at most this late.
        """)

    @validate("ready_after", "cull_warning_before")
    def _check_non_negative(self, proposal):
        if proposal["value"] < 0:
            raise TraitError(f"{proposal['trait'].name} must be a number of seconds >= 0, not {proposal['value']}")
        return proposal["value"]

    @validate("cull_check_every")
    def _check_every(self, proposal):
        if not proposal["value"] >= 1:
            raise TraitError(f"cull_check_every must be at least 1 second, not {proposal['value']}")
        return proposal["value"]


class WebhookNotifications(Configurable):
    """Webhooks (`c.WebhookNotifications.<option>`): a user may name a URL in their choices, on the
    admin's allow-list only, and gets Slack/Mattermost-compatible JSON there, signed."""

    allowed_urls = List(Unicode(), config=True, help="""
        Where users' webhooks may point.  An entry with "://" is a URL prefix
        (`https://hooks.slack.com/services/`): a webhook must have its scheme, host and port and
        a path under its path.  An entry without is a host name (`chat.example.org`): any https
        URL on that host.  Empty (the default): webhooks are off, and a user's URL is refused.
        The list is what stops a user from making the hub call an internal address: keep it to
        your chat servers.
        """)
    secret_file = Unicode("", config=True, help="""
        A file holding this deployment's webhook secret (its first line, at least 16 characters),
        e.g. a Docker secret.  Each delivery carries `X-GPUHub-Timestamp` and
        `X-GPUHub-Signature-256: sha256=<hex HMAC-SHA256 of "<timestamp>." + body>`, so a
        receiver that knows the secret can check that the hub sent it.  Required for webhooks.
        """)
    timeout = Float(5.0, config=True, help="""
        Seconds a delivery may take (connect, send, the answer).  Deliveries run on their own
        threads: a dead receiver delays only its own deliveries.
        """)
    max_attempts = Int(6, config=True, help="""
        Tries per delivery before it is given up (state `failed`).  Only a delivery that surely did
        not arrive (no connection, or an answer of 5xx, 408 or 429) is tried again; one whose
        answer never came is `unknown` and never repeated.
        """)
    retry_delay = Float(30.0, config=True, help="""
        Seconds before the first retry; each further retry waits twice as long (at most an hour).
        """)
    max_age = Float(12 * 3600.0, config=True, help="""
        Seconds an event may wait for its webhook delivery before it is dropped (state `expired`).
        """)
    per_hour = Int(30, config=True, help="""
        The most deliveries to one user's webhook in any hour; events beyond wait and then go
        together in one message.
        """)
    poll_interval = Float(1.0, config=True, help="Seconds between the webhook sender's looks at the outbox.")
    url_max = Int(2000, config=True, help="The longest webhook URL a user may set, in characters.")

    @validate("timeout", "retry_delay", "max_age", "poll_interval")
    def _check_seconds(self, proposal):
        if not proposal["value"] > 0:
            raise TraitError(f"{proposal['trait'].name} must be a number of seconds > 0, not {proposal['value']}")
        return proposal["value"]

    @validate("max_attempts", "per_hour", "url_max")
    def _check_count(self, proposal):
        if proposal["value"] < 1:
            raise TraitError(f"{proposal['trait'].name} must be at least 1, not {proposal['value']}")
        return proposal["value"]

    @property
    def enabled(self) -> bool:
        return bool(self.allowed_urls)

    def problems(self) -> list[str]:
        """What stops deliveries with these settings (empty: ready, or not enabled)."""
        if not self.enabled:
            return []
        if not self.secret_file:
            return ["WebhookNotifications.secret_file is empty"]
        try:
            if len(self.secret()) < 16:
                return ["WebhookNotifications.secret_file holds fewer than 16 characters"]
        except OSError as exc:
            return [f"WebhookNotifications.secret_file cannot be read: {exc.strerror}"]
        return []

    def secret(self) -> bytes:
        with open(self.secret_file, encoding="utf-8") as f:
            return f.readline().rstrip("\r\n").encode()


class BrowserNotifications(Configurable):
    """Browser notifications (`c.BrowserNotifications.<option>`): while a user has the GPU pool page
    open and has allowed its notifications, the page asks the gpu-pool service for the user's new
    events (`GET api/notifications/feed`) and shows each as a notification of the browser (the Web
    Notifications API), even when the tab is in the background."""

    enabled = Bool(True, config=True, help="""
        Offer browser notifications on the GPU pool page.  On by default: nothing is shown until a
        user presses the page's button and allows notifications in their browser.  Off: the page
        offers nothing and the feed answers 404; the events' browser rows expire after `max_age`.
        """)
    poll_interval = Float(5.0, min=1.0, config=True, help="""
        Seconds between an open pool page's asks for new events: a notification comes at most this
        late after its event (a server's "ready" after the hub says it is ready).  Browsers slow the
        timers of background tabs (Chromium: to once a minute after five minutes hidden).
        """)
    max_age = Float(600.0, min=1.0, config=True, help="""
        Seconds an event waits for an open page to take it; older ones are dropped (state
        `expired`), so a page opened tomorrow does not pop up yesterday's news.
        """)
    page_size = Int(10, min=1, config=True, help="""
        The most events one answer of the feed carries; more wait for the next ask.  The page shows
        at most three notifications at once and folds the rest into one "N more updates".
        """)
    polls_per_minute = Int(60, min=1, config=True, help="""
        The most asks of the feed per user and minute (all their tabs together); beyond it the feed
        answers 429 and the page waits a minute.
        """)

