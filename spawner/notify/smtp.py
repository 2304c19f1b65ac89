"""One mail over SMTP, and what became of it: sent, refused for good, refused for now (nothing
reached the server: safe to try again), or unknown (the message may have reached it).

Each step is bounded by `EmailNotifications.timeout`.  `before_data` runs just before the
message itself is sent (the sender records there that it may now reach the server), so a failure
up to then is retried and one after never is: each event is sent at most once.
"""

from __future__ import annotations

import contextlib
import smtplib
import ssl
from collections.abc import Callable
from email.message import EmailMessage
from email.utils import parseaddr
from typing import NamedTuple

from .settings import EmailNotifications

SENT, RETRY, FAILED, UNKNOWN = "sent", "retry", "failed", "unknown"


class Outcome(NamedTuple):
    result: str  # SENT, RETRY, FAILED, UNKNOWN
    error: str = ""  # for the outbox's record and the log: never a password


def _context(s: EmailNotifications) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=s.ca_file or None)
    if not s.verify_certificate:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _reply(code: int, text: bytes | str) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return f"{code} {' '.join(str(text).split())}"[:300]


def send(msg: EmailMessage, s: EmailNotifications, before_data: Callable[[], None] = lambda: None) -> Outcome:
    """Send `msg` to its To address through `s`'s server (blocking: call it off the loop)."""
    to = parseaddr(msg["To"])[1]
    sender = parseaddr(msg["From"])[1]
    conn: smtplib.SMTP | None = None
    try:
        if s.security == "tls":
            conn = smtplib.SMTP_SSL(s.smtp_host, s.smtp_port, timeout=s.timeout, context=_context(s))
        else:
            conn = smtplib.SMTP(s.smtp_host, s.smtp_port, timeout=s.timeout)
        conn.ehlo()
        if s.security == "starttls":
            if not conn.has_extn("starttls"):
                return Outcome(RETRY, f"{s.smtp_host}:{s.smtp_port} does not offer STARTTLS "
                                      "(EmailNotifications.security)")
            conn.starttls(context=_context(s))
            conn.ehlo()
        password = s.password()
        if s.username and password is not None:
            conn.login(s.username, password)
        code, text = conn.mail(sender)
        if code != 250:
            return Outcome(FAILED if code >= 500 else RETRY, f"MAIL FROM refused: {_reply(code, text)}")
        code, text = conn.rcpt(to)
        if code not in (250, 251):
            return Outcome(FAILED if code >= 500 else RETRY, f"RCPT TO refused: {_reply(code, text)}")
    except smtplib.SMTPAuthenticationError as e:
        return Outcome(FAILED, f"the SMTP server refused the login of {s.username!r}: "
                               f"{_reply(e.smtp_code, e.smtp_error)}")
    except (OSError, smtplib.SMTPException, ssl.SSLError) as e:
        _close(conn)
        return Outcome(RETRY, f"{s.smtp_host}:{s.smtp_port}: {type(e).__name__}: {e}"[:300])
    try:
        before_data()
    except Exception as e:  # the ledger could not record it: send nothing, try again later
        _close(conn)
        return Outcome(RETRY, f"not sent: the outbox could not be updated ({type(e).__name__})")
    try:
        code, text = conn.data(msg.as_bytes())
    except smtplib.SMTPDataError as e:  # the server answered DATA: it did not take the message
        _close(conn)
        return Outcome(FAILED if e.smtp_code >= 500 else RETRY, f"DATA refused: {_reply(e.smtp_code, e.smtp_error)}")
    except (TimeoutError, OSError, smtplib.SMTPException) as e:
        _close(conn)
        return Outcome(UNKNOWN, f"the connection failed while sending the message: {type(e).__name__}")
    _quit(conn)
    if code == 250:
        return Outcome(SENT, "")
    # The server answered the message: refused for good (5xx) or for now (4xx), not taken either way.
    return Outcome(FAILED if code >= 500 else RETRY, f"the message was refused: {_reply(code, text)}")


def _quit(conn) -> None:
    try:
        conn.quit()
    except (OSError, smtplib.SMTPException):
        _close(conn)


def _close(conn) -> None:
    if conn is not None:
        with contextlib.suppress(OSError):
            conn.close()
