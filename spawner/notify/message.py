"""Events as a mail: plain text and escaped HTML, one event or a digest of several.

No header carries user input unfiltered: every header value passes `header_safe` (control
characters, CR and LF among them, become spaces; its length is capped), and the mail library's
own policy refuses a line break in a header besides.  In the HTML part every value is escaped.
"""

from __future__ import annotations

import email.policy
import html
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid

from jupyterhub.utils import url_path_join

from ..pool.ledger.events import BOOKED_OUT, BOOKING, BUDGET, CULL_WARNING, GRANTED, JOB_ENDED, RECLAIMED
from ..pool.ledger.outbox import Entry

_CONTROL = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029]+")
HEADER_MAX = 200
# CRLF line ends (smtplib sends bytes as they are); header lines up to RFC 5322's 998 characters,
# so a long link in List-Unsubscribe stays a plain URL (body lines past it are quoted-printable).
POLICY = email.policy.SMTP.clone(max_line_length=998)
SUBJECT_PREFIX = "GPU hub"


def header_safe(value: str, limit: int = HEADER_MAX) -> str:
    """`value` on one line (control characters as spaces), at most `limit` characters."""
    one = _CONTROL.sub(" ", str(value)).strip()
    return one if len(one) <= limit else one[:limit - 1] + "…"


@dataclass(frozen=True)
class Links:
    hub: str  # the hub's public URL, with its base path ("https://hub.example.org/")
    service: str  # the gpu-pool service's ("https://hub.example.org/services/gpu-pool/")
    unsubscribe: dict[str, str]  # event -> its signed unsubscribe link


def _hours(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def describe(entry: Entry, links: Links) -> tuple[str, list[tuple[str, str]], str | None]:
    """(the event's one-line title, its facts as (label, value) rows, its link)."""
    p = entry.payload
    if entry.event == GRANTED:
        server = p.get("server_name") or ""
        # The sender tells a grant once the server is ready (ready.py), with the server's own link.
        path = p.get("server_url") or url_path_join(links.hub, "hub", "spawn-pending", entry.user, server)
        title = (f"Your GPU{'s are' if int(p.get('gpus') or 1) > 1 else ' is'} ready: "
                 f"your server {server or '(default)'} is running")
        rows = [("Server", server or "(default)"), ("GPUs", str(p.get("gpus"))), ("Host", str(p.get("host"))),
                ("Waited in the queue", _hours(float(p.get("waited_s") or 0)))]
        return title, rows, path
    if entry.event == CULL_WARNING:
        server = p.get("server_name") or ""
        at = datetime.fromisoformat(str(p.get("deadline")))
        left = max(0.0, (at - datetime.now(UTC)).total_seconds())
        minutes = max(1, round(left / 60))
        when = at.astimezone(UTC).strftime("%H:%M UTC")
        rows = [("Server", server or "(default)"), ("Stops at", when), ("Why", str(p.get("reason") or ""))]
        if p.get("by_max_age"):
            title = f"Your server {server or '(default)'} stops in {minutes} min: it reaches its maximum age"
            rows.append(("Open it to save your work", str(p.get("server_url") or "")))
            return title, rows, p.get("server_url")
        title = f"Your server {server or '(default)'} will be stopped in {minutes} min: it has been idle"
        rows.append(("Open it", str(p.get("server_url") or "")))
        rows.append(("Keep it running (counts as activity)", "the link below"))
        return title, rows, p.get("keep_url") or p.get("server_url")
    if entry.event == JOB_ENDED:
        job = p.get("job_id")
        state = str(p.get("state"))
        title = f"Your job {job} ended: {state}"
        rows = [("Job", str(job)), ("State", state),
                ("Exit code", "none" if p.get("exit_code") is None else str(p.get("exit_code"))),
                ("Ran for", _hours(float(p.get("ran_s") or 0))), ("GPU-hours", f"{float(p.get('gpu_hours') or 0):.3f}"),
                ("Command", str(p.get("command") or ""))]
        if p.get("message"):
            rows.append(("Why", str(p["message"])))
        return title, rows, url_path_join(links.service, "jobs", str(job))
    if entry.event == RECLAIMED:
        job, name = p.get("job_id"), str(p.get("server_name") or "")
        what = f"job {job}" if job is not None else f"server {name or '(default)'}"
        at = datetime.fromisoformat(str(p.get("stops_at")))
        left = max(0.0, (at - datetime.now(UTC)).total_seconds())
        title = f"Your {what} runs on borrowed GPUs that are asked back: it stops in {_hours(left)}"
        rows = [("Job" if job is not None else "Server", str(job) if job is not None else name or "(default)"),
                ("GPUs", str(p.get("gpus"))), ("Hosts", ", ".join(p.get("hosts") or ())),
                ("Stops at", at.astimezone(UTC).strftime("%H:%M:%S UTC")),
                ("Why", "a request within its share needs them; a job is queued again by itself unless it "
                        "was submitted with --no-requeue" if job is not None else
                        "a request within its share needs them; save your work: the server is stopped then, as "
                        "an idle cull would stop it (your home stays)")]
        link = url_path_join(links.service, "jobs", str(job)) if job is not None else links.hub
        return title, rows, link
    if entry.event == BUDGET:
        who = str(p.get("who") or "you")
        whose = "Your" if who == "you" else f"{who[0].upper()}{who[1:]}'s"
        limit = float(p.get("limit") or 0)
        if int(p.get("percent") or 0) >= 100:
            title = f"{whose} GPU-hour budget ({limit:g} GPU-hours) is used up: GPU servers and jobs stop"
            then = "The culler stops the GPU servers and jobs it pays for; new ones are refused until hours free."
        else:
            title = f"{whose} GPU-hour budget is {int(p.get('percent') or 0)} % used ({limit:g} GPU-hours)"
            then = "At 100 % the culler stops the GPU servers and jobs it pays for."
        rows = [("Budget", str(p.get("message") or "")), ("Then", then)]
        if p.get("runs_out_at") and int(p.get("percent") or 0) < 100:
            at = datetime.fromisoformat(str(p["runs_out_at"]))
            rows.append(("Used up at", at.astimezone(UTC).strftime("%a %H:%M UTC") + " with the GPUs held now"))
        return title, rows, links.service
    if entry.event in (BOOKING, BOOKED_OUT):
        starts, ends = (datetime.fromisoformat(str(p.get(k))) for k in ("starts_at", "ends_at"))
        until = _hours(max(0.0, (starts - datetime.now(UTC)).total_seconds()))
        window = f"{starts.astimezone(UTC).strftime('%a %H:%M')} to {ends.astimezone(UTC).strftime('%H:%M UTC')}"
        rows = [("Booking", f"{p.get('gpus')} GPU(s) of {p.get('host')}, {window}")]
        if entry.event == BOOKED_OUT:
            server = str(p.get("server_name") or "")
            what = f"job {server.split('/')[1]}" if server.startswith("job/") else f"server {server or '(default)'}"
            title = f"Your {what} stops in {until}: its GPU is booked by someone else from then"
            rows += [("Stops at", starts.astimezone(UTC).strftime("%a %H:%M UTC")),
                     ("Do", "save your work before, or move to GPUs that are not booked")]
            return title, rows, links.service
        if p.get("kind") == "soon":
            return f"Your booking of {p.get('gpus')} GPU(s) starts in {until}", rows, links.service
        return (f"Your booked GPUs are ready: {p.get('gpus')} GPU(s) of {p.get('host')}, until "
                f"{ends.astimezone(UTC).strftime('%H:%M UTC')}"), rows, url_path_join(links.hub, "hub", "spawn")
    return f"{entry.event}", [], None


def compose(entries: list[Entry], to: str, sender: str, links: Links, domain: str = "gpu-hub.invalid") -> EmailMessage:
    """One mail to `to` telling `entries` (one user's): a digest when there are several."""
    parts = [describe(e, links) for e in entries]
    if len(parts) == 1:
        subject = f"{SUBJECT_PREFIX}: {parts[0][0]}"
    else:
        subject = f"{SUBJECT_PREFIX}: {len(parts)} updates about your GPUs and jobs"
    events = sorted({e.event for e in entries})
    text_lines: list[str] = []
    html_parts: list[str] = []
    if len(parts) > 1:
        text_lines += [f"{len(parts)} things happened since the last mail (sent together: at most a few mails "
                       "an hour).", ""]
        html_parts.append(f"<p>{len(parts)} things happened since the last mail (sent together: at most a few mails "
                          "an hour).</p>")
    for title, rows, link in parts:
        text_lines.append(title)
        text_lines += [f"  {label}: {value}" for label, value in rows]
        if link:
            text_lines.append(f"  {link}")
        text_lines.append("")
        cells = "".join(f"<tr><th align=\"left\">{html.escape(label)}</th><td>{html.escape(value)}</td></tr>"
                        for label, value in rows)
        link_html = f'<p><a href="{html.escape(link, quote=True)}">{html.escape(link)}</a></p>' if link else ""
        html_parts.append(f"<h3>{html.escape(title)}</h3><table>{cells}</table>{link_html}")
    unsubscribe = [links.unsubscribe[e] for e in events if e in links.unsubscribe]
    text_lines.append("You get this mail because of your notification choices at "
                      f"{url_path_join(links.service, 'api', 'notifications')}.")
    for event in events:
        if event in links.unsubscribe:
            text_lines.append(f"Stop mails about {event}: {links.unsubscribe[event]}")
    html_parts.append("<p><small>" + " · ".join(
        f'<a href="{html.escape(links.unsubscribe[e], quote=True)}">Stop mails about {html.escape(e)}</a>'
        for e in events if e in links.unsubscribe) + "</small></p>")

    msg = EmailMessage(policy=POLICY)
    msg["Subject"] = header_safe(subject)
    msg["From"] = header_safe(sender, 320)
    msg["To"] = header_safe(to, 320)
    msg["Date"] = format_datetime(datetime.now(UTC))
    msg["Message-ID"] = make_msgid("gpu-notify", domain=domain)
    msg["Auto-Submitted"] = "auto-generated"
    if unsubscribe:
        # RFC 8058: the mail client's one-click button POSTs to the first link.
        msg["List-Unsubscribe"] = ", ".join(f"<{header_safe(u, 2000)}>" for u in unsubscribe)
        msg["List-Unsubscribe-Post"] = "List-Unsubscribe=One-Click"
    msg.set_content("\n".join(text_lines))
    msg.add_alternative("<!DOCTYPE html><html><body>" + "".join(html_parts) + "</body></html>", subtype="html")
    return msg
