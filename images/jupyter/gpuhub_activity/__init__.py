"""gpuhub_activity: a jupyter-server extension that counts a working kernel as activity,
posts the activity that ends a quiet spell to the hub at once, serves the in-lab GPU
status (lab.py: GET gpuhub/status, POST gpuhub/keep), tells the open tabs why the server
stops when its lease was ended (notice.py), and has JupyterHub's HTTP client find the hub
at its current address (hub_dns.py).

Installed and enabled in GPU JupyterHub's notebook images
(etc/jupyter/jupyter_server_config.d/gpuhub.json), so the image's own start
command (`jupyterhub-singleuser`) needs no wrapper.

jupyter-server counts kernel *messages* as activity, not a kernel being busy:
a cell that trains for an hour without printing looks idle, and the idle
culler would stop it (upstream jupyterhub-idle-culler#55).  This extension
checks the kernels every `BusyKernelActivity.interval` seconds and, while one
of them is really working, sets the `gpuhub_busy_kernels_last_activity`
web-app setting, which jupyter-server's documented `*_last_activity` hook
adds to the activity that jupyterhub-singleuser reports to the hub.

A kernel that is busy only because it waits for a person does not count:

- a cell blocked in `input()`, `getpass()` or a `pdb`/`breakpoint()` prompt
  (the kernel sent an `input_request` on its stdin channel and no
  `input_reply` came back yet);
- a kernel stopped at a breakpoint of JupyterLab's visual debugger (its last
  `debug_event` was `stopped`, not `continued`).

Both are seen in the messages that pass through the server's kernel
websocket connections (a subclass of the configured connection class), so a
prompt left open in a closed browser tab still counts as waiting.

Setting the environment variable GPUHUB_BUSY_KERNELS_ACTIVITY=0 (the hub does
so with GPUHUB_CULL_KEEP_BUSY=false) turns the counting of busy kernels off.

The hub hears of a server's activity only at jupyterhub-singleuser's periodic
reports (every JUPYTERHUB_ACTIVITY_INTERVAL seconds): work that starts again
after a quiet spell, shortly before a cull pass, would reach the hub too late,
and the culler would stop a busy server.  `QuietSpellReport` closes that
window: when the server's activity (jupyter-server's own `last_activity()`:
API requests, kernel messages, terminals, the busy kernels above) follows a
quiet spell longer than GPUHUB_ACTIVITY_QUIET_AFTER seconds (the hub passes a
third of its shortest idle limit), it posts that activity to the hub at once
through the hub's public activity API, with the server's own token, as
jupyterhub-singleuser does.  One post per quiet spell: continuous work adds
no requests.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone

from traitlets import Bool, Float, default
from traitlets.config import LoggingConfigurable

__version__ = "1.0.0"

SETTING = "gpuhub_busy_kernels_last_activity"
ENV_SWITCH = "GPUHUB_BUSY_KERNELS_ACTIVITY"


def _jupyter_server_extension_points():
    # The app point only for its stop hook (notice.py: why the server stops, told to the open tabs).
    from .notice import StopNotice

    return [{"module": "gpuhub_activity"}, {"module": "gpuhub_activity.notice", "app": StopNotice}]


class WaitingKernels:
    """Which kernels wait for a person: kernel id -> set of reasons ("input", "debugger")."""

    def __init__(self):
        self._reasons: dict[str, set[str]] = {}

    def set(self, kernel_id: str, reason: str, waiting: bool) -> None:
        reasons = self._reasons.setdefault(kernel_id, set())
        if waiting:
            reasons.add(reason)
        else:
            reasons.discard(reason)
            if not reasons:
                self._reasons.pop(kernel_id, None)

    def waiting(self, kernel_id: str) -> bool:
        return bool(self._reasons.get(kernel_id))

    def forget(self, kernel_id: str) -> None:
        self._reasons.pop(kernel_id, None)

    def kernel_ids(self) -> list[str]:
        return list(self._reasons)


WAITING = WaitingKernels()


def _header_and_content(session, channel, msg_or_parts):
    """(msg_type, content) of a kernel message, deserialised or as raw frames."""
    if isinstance(msg_or_parts, dict):
        header = msg_or_parts.get("header") or {}
        content = msg_or_parts.get("content")
        if header and content is not None:
            return header.get("msg_type"), content
    # Raw frames (v1 websocket protocol): header, parent_header, metadata, content, ...
    parts = msg_or_parts if isinstance(msg_or_parts, list) else []
    header = session.unpack(parts[0]) if parts else {}
    msg_type = header.get("msg_type")
    content = session.unpack(parts[3]) if msg_type == "debug_event" and len(parts) > 3 else {}
    return msg_type, content


def observe_outgoing(kernel_id: str, channel: str | None, msg_type: str | None, content: dict) -> None:
    """A message from the kernel to a browser."""
    if channel == "stdin" and msg_type == "input_request":
        WAITING.set(kernel_id, "input", True)
    elif channel == "iopub" and msg_type == "debug_event":
        event = (content or {}).get("event")
        if event == "stopped":
            WAITING.set(kernel_id, "debugger", True)
        elif event in ("continued", "terminated", "exited"):
            WAITING.set(kernel_id, "debugger", False)


def observe_incoming(kernel_id: str, channel: str | None, msg_type: str | None) -> None:
    """A message from a browser to the kernel."""
    if channel == "stdin" and msg_type == "input_reply":
        WAITING.set(kernel_id, "input", False)


def _incoming_type(raw) -> tuple[str | None, str | None]:
    """(channel, msg_type) of a websocket message from the browser, either protocol."""
    if isinstance(raw, str):
        msg = json.loads(raw)
        return msg.get("channel"), (msg.get("header") or {}).get("msg_type")
    from jupyter_server.services.kernels.connection.base import (
        deserialize_binary_message,
        deserialize_msg_from_ws_v1,
    )

    try:
        channel, parts = deserialize_msg_from_ws_v1(raw)
        header = json.loads(parts[0]) if parts else {}
        return channel, header.get("msg_type")
    except Exception:
        msg = deserialize_binary_message(raw)
        return msg.get("channel"), (msg.get("header") or {}).get("msg_type")


def tracking_connection_class(base):
    """A subclass of the server's kernel websocket connection class that
    notices prompts and debugger stops passing through it."""

    class WaitTrackingConnection(base):
        def handle_incoming_message(self, incoming_msg):
            try:
                channel, msg_type = _incoming_type(incoming_msg)
                observe_incoming(self.kernel_id, channel, msg_type)
            except Exception:  # never break a user's connection over bookkeeping
                self.log.debug("gpuhub_activity: cannot read an incoming message", exc_info=True)
            return super().handle_incoming_message(incoming_msg)

        def _on_zmq_reply(self, stream, msg_list):
            try:
                channel = getattr(stream, "channel", None)
                if channel in ("stdin", "iopub"):
                    msg_type, content = _header_and_content(self.session, channel, msg_list)
                    observe_outgoing(self.kernel_id, channel, msg_type, content)
            except Exception:
                self.log.debug("gpuhub_activity: cannot read an outgoing message", exc_info=True)
            return super()._on_zmq_reply(stream, msg_list)

    WaitTrackingConnection.__name__ = f"WaitTracking{base.__name__}"
    return WaitTrackingConnection


class BusyKernelActivity(LoggingConfigurable):
    """Counts kernels that are working (busy, not waiting for a person) as server activity."""

    enabled = Bool(
        True,
        help="Count a working kernel as activity (in the notebook server's jupyter_server_config). "
        "On unless the container's environment variable GPUHUB_BUSY_KERNELS_ACTIVITY is "
        "0/false/no/off (the hub sets it from GPUHUB_CULL_KEEP_BUSY).",
    ).tag(config=True)

    @default("enabled")
    def _default_enabled(self):
        return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")

    interval = Float(
        1.0,
        help="Seconds between checks of the kernels (in the notebook server's "
        "jupyter_server_config).  The activity reported to the hub is at most this stale; a "
        "check only reads the server's own kernel table.",
    ).tag(config=True)

    def __init__(self, serverapp, **kwargs):
        super().__init__(parent=serverapp, **kwargs)
        self.serverapp = serverapp
        self._callback = None

    def working_kernels(self) -> list[str]:
        km = self.serverapp.kernel_manager
        working = []
        for kernel_id in list(km.list_kernel_ids()):
            try:
                state = getattr(km.get_kernel(kernel_id), "execution_state", None)
            except KeyError:
                continue
            if state != "busy":
                # Idle, restarted or interrupted: any prompt it showed is gone.
                WAITING.forget(kernel_id)
            elif not WAITING.waiting(kernel_id):
                working.append(kernel_id)
        for kernel_id in WAITING.kernel_ids():
            if kernel_id not in km:
                WAITING.forget(kernel_id)
        return working

    def check(self) -> None:
        if self.working_kernels():
            self.serverapp.web_app.settings[SETTING] = datetime.now(timezone.utc)

    def start(self) -> None:
        from tornado.ioloop import PeriodicCallback

        settings = self.serverapp.web_app.settings
        base = settings.get("kernel_websocket_connection_class")
        if base is not None:
            settings["kernel_websocket_connection_class"] = tracking_connection_class(base)
        self._callback = PeriodicCallback(self.check, self.interval * 1000)
        self._callback.start()
        self.log.info("gpuhub_activity: busy kernels count as activity (checked every %g s; "
                      "kernels waiting for input or stopped in the debugger do not)", self.interval)


QUIET_ENV = "GPUHUB_ACTIVITY_QUIET_AFTER"
POST_TIMEOUT = 10.0


def _isoformat(when: datetime) -> str:
    return when.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


class QuietSpellReport(LoggingConfigurable):
    """Posts the server's activity to the hub at once when it follows a quiet spell."""

    quiet_after = Float(
        help="Seconds without activity after which the next activity is posted to the hub at "
        "once, not at jupyterhub-singleuser's next periodic report (in the notebook server's "
        "jupyter_server_config, or the container's environment variable "
        "GPUHUB_ACTIVITY_QUIET_AFTER, which the hub sets to a third of its shortest idle "
        "limit).  0, the default without that variable, turns the immediate post off.",
    ).tag(config=True)

    @default("quiet_after")
    def _default_quiet_after(self):
        try:
            return max(0.0, float(os.environ.get(QUIET_ENV, "0")))
        except ValueError:
            return 0.0

    interval = Float(
        1.0,
        help="Seconds between looks at the server's last activity (in the notebook server's "
        "jupyter_server_config): work after a quiet spell reaches the hub at most this much "
        "later.  A look reads only jupyter-server's own activity timestamps.",
    ).tag(config=True)

    def __init__(self, serverapp, **kwargs):
        super().__init__(parent=serverapp, **kwargs)
        self.serverapp = serverapp
        # Set by the hub in every server it spawns, as jupyterhub-singleuser reads them.
        self.url = os.environ.get("JUPYTERHUB_ACTIVITY_URL", "")
        self.token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
        self.server_name = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
        self._seen: datetime | None = None
        self._posting = False
        self._callback = None

    @property
    def enabled(self) -> bool:
        return bool(self.quiet_after > 0 and self.url and self.token)

    def check(self) -> None:
        """One look: the server's last activity, posted if it ends a quiet spell."""
        try:
            last = self.serverapp.web_app.last_activity()
        except Exception:
            self.log.debug("gpuhub_activity: cannot read the server's last activity", exc_info=True)
            return
        seen, self._seen = self._seen, max(last, self._seen) if self._seen else last
        if seen is None or last <= seen:
            return
        if (last - seen).total_seconds() > self.quiet_after and not self._posting:
            self._posting = True
            self._send(last, (last - seen).total_seconds())

    def _send(self, when: datetime, quiet: float) -> None:
        from tornado.ioloop import IOLoop

        IOLoop.current().add_callback(self.post, when, quiet)

    async def post(self, when: datetime, quiet: float) -> bool:
        """POST the activity to the hub; a failure is logged, never raised."""
        from tornado.httpclient import AsyncHTTPClient, HTTPRequest

        stamp = _isoformat(when)
        body = {"last_activity": stamp, "servers": {self.server_name: {"last_activity": stamp}}}
        request = HTTPRequest(self.url, method="POST", body=json.dumps(body),
                              headers={"Authorization": f"token {self.token}",
                                       "Content-Type": "application/json"},
                              request_timeout=POST_TIMEOUT, connect_timeout=POST_TIMEOUT)
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except Exception as exc:
            self.log.warning("gpuhub_activity: the hub did not take the activity after a quiet spell: %s", exc)
            return False
        finally:
            self._posting = False
        if response.code >= 400:
            self.log.warning("gpuhub_activity: the hub did not take the activity after a quiet spell (%s)",
                             response.code)
            return False
        self.log.info("gpuhub_activity: activity after %.0f s of quiet posted to the hub at once", quiet)
        return True

    def start(self) -> None:
        from tornado.ioloop import PeriodicCallback

        self._callback = PeriodicCallback(self.check, self.interval * 1000)
        self._callback.start()
        self.log.info("gpuhub_activity: activity after %g s of quiet reaches the hub at once", self.quiet_after)


def _load_jupyter_server_extension(serverapp):
    from . import hub_dns, lab, notify

    hub_dns.use_system_resolver(serverapp.log)  # the hub found at its current address (hub_dns.py)
    lab.load(serverapp)  # the in-lab status, whether busy kernels count or not
    notify.load(serverapp)  # the in-lab notifications (issue 39)
    quiet = QuietSpellReport(serverapp)  # whether busy kernels count or not
    if quiet.enabled:
        quiet.start()
        serverapp.web_app.settings["gpuhub_quiet_spell_report"] = quiet
    activity = BusyKernelActivity(serverapp)
    if not activity.enabled:
        serverapp.log.info("gpuhub_activity: off (%s)", ENV_SWITCH)
        return
    activity.start()
    serverapp.web_app.settings["gpuhub_busy_kernel_activity"] = activity


# The name older jupyter-server versions look for.
load_jupyter_server_extension = _load_jupyter_server_extension
