"""The demo's mail sink: an SMTP server (aiosmtpd) on 127.0.0.1 that keeps what the hub mails, and a
small page on 127.0.0.1 that lists it, newest first, so `make demo` shows the notification mails
(ready, job ended, cull warnings with their "keep it" link) without a mail server.

    .venv/bin/python -m devservices.mail_sink --smtp-port 2525 --page-port 8025

Bounded: at most `keep` messages (the oldest go), each at most MESSAGE_MAX bytes (a larger one is
refused by the SMTP server, 552); loopback only.  The page refreshes itself every few seconds;
`/messages.json` gives the same as JSON.  Everything a mail says is escaped on the page; only its
http(s) links are made clickable.
"""

from __future__ import annotations

import argparse
import email
import email.policy
import html
import json
import re
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOST = "127.0.0.1"
KEEP = 100
MESSAGE_MAX = 256 * 1024
TEXT_MAX = 20_000  # characters of a mail's text shown
_LINK = re.compile(r"https?://[^\s<>\"']+")


class MailSink:
    """Start with `start()` (both servers in threads), stop with `stop()`."""

    def __init__(self, smtp_port: int, page_port: int, keep: int = KEEP):
        self.smtp_port, self.page_port = smtp_port, page_port
        self.messages: deque[dict] = deque(maxlen=keep)
        self._lock = threading.Lock()
        self._controller = None
        self._http: ThreadingHTTPServer | None = None

    @property
    def page_url(self) -> str:
        return f"http://{HOST}:{self.page_port}/"

    # --- SMTP -----------------------------------------------------------------------------

    async def handle_DATA(self, server, session, envelope):  # aiosmtpd's handler hook
        msg = email.message_from_bytes(envelope.original_content or envelope.content, policy=email.policy.default)
        try:
            body = msg.get_body(("plain",))
            text = body.get_content() if body is not None else ""
        except (KeyError, LookupError, ValueError):
            text = "(the text of this mail could not be read)"
        with self._lock:
            self.messages.append({"received_at": time.time(), "to": list(envelope.rcpt_tos),
                                  "from": str(msg.get("From", "")), "subject": str(msg.get("Subject", "")),
                                  "text": text[:TEXT_MAX]})
        return "250 OK"

    # --- the page --------------------------------------------------------------------------

    def received(self) -> list[dict]:
        """The kept messages, newest first."""
        with self._lock:
            return list(reversed(self.messages))

    def page(self) -> str:
        rows = []
        for m in self.received():
            when = time.strftime("%H:%M:%S", time.localtime(m["received_at"]))
            text = _LINK.sub(lambda g: f'<a href="{g.group(0)}">{g.group(0)}</a>', html.escape(m["text"]))
            rows.append(f"<article><h2>{html.escape(m['subject'])}</h2>"
                        f"<p>{when} · to {html.escape(', '.join(m['to']))} · from {html.escape(m['from'])}</p>"
                        f"<pre>{text}</pre></article>")
        body = "".join(rows) or "<p id='empty'>No mail yet. Queue behind a full pool, or wait for a cull warning.</p>"
        return ("<!DOCTYPE html><html><head><meta charset='utf-8'><meta http-equiv='refresh' content='5'>"
                "<title>Demo mail sink</title><style>pre{white-space:pre-wrap;background:#f6f6f6;padding:.5em}"
                "article{border-bottom:1px solid #ccc}</style></head><body>"
                f"<h1>Mail the hub sent ({len(self.messages)}, the newest {self.messages.maxlen} kept)</h1>"
                f"{body}</body></html>")

    def start(self) -> None:
        from aiosmtpd.controller import Controller

        self._controller = Controller(self, hostname=HOST, port=self.smtp_port, data_size_limit=MESSAGE_MAX)
        self._controller.start()
        sink = self

        class Page(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                if self.path == "/":
                    self._answer(200, "text/html; charset=utf-8", sink.page())
                elif self.path == "/messages.json":
                    self._answer(200, "application/json", json.dumps(sink.received()))
                else:
                    self._answer(404, "text/plain", "Not found: the mails are at / and /messages.json\n")

            def _answer(self, status: int, kind: str, text: str) -> None:
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format, *args):  # quiet: the demo's terminal shows its banner
                pass

        self._http = ThreadingHTTPServer((HOST, self.page_port), Page)
        self._http.daemon_threads = True
        threading.Thread(target=self._http.serve_forever, name="mail-sink-page", daemon=True).start()

    def stop(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self._controller is not None:
            self._controller.stop()
            self._controller = None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smtp-port", type=int, default=2525)
    parser.add_argument("--page-port", type=int, default=8025)
    args = parser.parse_args(argv)
    sink = MailSink(args.smtp_port, args.page_port)
    sink.start()
    print(f"SMTP on {HOST}:{args.smtp_port}; the mails at {sink.page_url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        sink.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
