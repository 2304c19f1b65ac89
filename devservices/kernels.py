"""Kernels in a user's single-user server, driven through the proxy like a browser does.

Jupyter's REST API starts the kernel; code goes over the kernel's websocket
channel with the user's token.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import requests

V1_PROTOCOL = "v1.kernel.websocket.jupyter.org"


def to_v1(msg: dict) -> bytes:
    """A message in the v1 binary websocket protocol: offsets, channel, then the parts."""
    parts = [json.dumps(msg[k]).encode() for k in ("header", "parent_header", "metadata", "content")]
    channel = msg["channel"].encode()
    offsets = [8 * (1 + 1 + len(parts) + 1)]
    offsets.append(offsets[-1] + len(channel))
    for part in parts:
        offsets.append(offsets[-1] + len(part))
    head = len(offsets).to_bytes(8, "little") + b"".join(o.to_bytes(8, "little") for o in offsets)
    return head + channel + b"".join(parts)


def from_v1(raw: bytes) -> dict:
    count = int.from_bytes(raw[:8], "little")
    offsets = [int.from_bytes(raw[8 * (i + 1):8 * (i + 2)], "little") for i in range(count)]
    offsets.append(len(raw))
    chunks = [raw[offsets[i]:offsets[i + 1]] for i in range(count)]
    header, parent, metadata, content = (json.loads(c) for c in chunks[1:5])
    return {"channel": chunks[0].decode(), "header": header, "parent_header": parent,
            "metadata": metadata, "content": content, "msg_type": header["msg_type"]}


class Kernel:
    """A kernel in a user's server, started and driven through the proxy."""

    def __init__(self, hub, user: str, token: str):
        self.hub, self.user, self.token = hub, user, token
        self.base = f"{hub.url}/user/{user}/api"
        r = requests.post(f"{self.base}/kernels", json={"name": "python3"},
                          headers=self.headers, timeout=60)
        assert r.status_code == 201, r.text
        self.id = r.json()["id"]

    @property
    def headers(self) -> dict:
        return {"Authorization": f"token {self.token}"}

    def model(self) -> dict | None:
        r = requests.get(f"{self.base}/kernels/{self.id}", headers=self.headers, timeout=30,
                         params={"no_track_activity": "1"})
        return r.json() if r.status_code == 200 else None

    def execute_and_leave(self, code: str, timeout: float = 60) -> None:
        """Send `code`, wait until the kernel says it is busy with it, then disconnect
        (the browser tab is closed: nothing is connected while it runs)."""
        asyncio.run(self._execute(code, timeout, until="busy"))

    def prompt_and_leave(self, code: str, timeout: float = 60, protocol: str = "") -> str:
        """Send `code` with stdin allowed, wait until the kernel asks for input
        (an `input()` or pdb prompt), then disconnect without answering: the
        person walked away.  Returns the prompt.  `protocol="v1"` speaks
        JupyterLab's binary websocket protocol (v1.kernel.websocket.jupyter.org),
        else the JSON one."""
        return asyncio.run(self._execute(code, timeout, until="input_request", allow_stdin=True,
                                         protocol=protocol))

    def stop_in_debugger_and_leave(self, code: str, line: int, timeout: float = 60) -> dict:
        """What JupyterLab's debugger panel does: start a debug session (DAP over
        the control channel), set a breakpoint at `line` of the cell `code`, run
        it until it stops there, then disconnect.  Returns the `stopped` event."""
        return asyncio.run(self._debug(code, line, timeout))

    async def _debug(self, code: str, line: int, timeout: float) -> dict:
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        url = f"{self.base}/kernels/{self.id}/channels".replace("http://", "ws://")
        ws = await websocket_connect(HTTPRequest(url, headers=self.headers, request_timeout=timeout))
        session = uuid.uuid4().hex
        deadline = time.monotonic() + timeout

        def send(channel: str, msg_type: str, content: dict) -> str:
            msg_id = uuid.uuid4().hex
            ws.write_message(json.dumps({
                "header": {"msg_id": msg_id, "username": self.user, "session": session,
                           "msg_type": msg_type, "version": "5.3", "date": ""},
                "parent_header": {}, "metadata": {}, "channel": channel, "buffers": [], "content": content}))
            return msg_id

        async def until(match) -> dict:
            while time.monotonic() < deadline:
                raw = await asyncio.wait_for(ws.read_message(), timeout=deadline - time.monotonic())
                assert raw is not None, "the kernel's websocket closed"
                msg = json.loads(raw)
                if match(msg):
                    return msg
            raise AssertionError(f"no answer from the kernel's debugger in {timeout} s")

        seq = 0

        async def dap(command: str, arguments: dict | None = None) -> dict:
            nonlocal seq
            seq += 1
            msg_id = send("control", "debug_request", {"type": "request", "seq": seq, "command": command,
                                                       "arguments": arguments or {}})
            reply = await until(lambda m: m.get("msg_type") == "debug_reply"
                                and m["parent_header"].get("msg_id") == msg_id)
            assert reply["content"].get("success"), reply["content"]
            return reply["content"].get("body") or {}

        try:
            await dap("initialize", {"clientID": "test", "clientName": "test", "adapterID": "python",
                                     "pathFormat": "path", "linesStartAt1": True, "columnsStartAt1": True})
            await dap("attach")
            source = (await dap("dumpCell", {"code": code}))["sourcePath"]
            await dap("setBreakpoints", {"source": {"path": source}, "breakpoints": [{"line": line}],
                                         "sourceModified": False})
            await dap("configurationDone")
            send("shell", "execute_request", {"code": code, "silent": False, "store_history": False,
                                              "user_expressions": {}, "allow_stdin": False,
                                              "stop_on_error": True})
            event = await until(lambda m: m.get("msg_type") == "debug_event"
                                and m["content"].get("event") == "stopped")
            return event["content"]
        finally:
            ws.close()

    def run(self, code: str, timeout: float = 120) -> str:
        """Run `code` to the end and return what it printed (stdout and stderr).
        An exception in the kernel fails the test with its traceback."""
        return asyncio.run(self._execute(code, timeout, until="idle"))

    async def _execute(self, code: str, timeout: float, until: str, allow_stdin: bool = False,
                       protocol: str = "") -> str:
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        url = f"{self.base}/kernels/{self.id}/channels".replace("http://", "ws://")
        v1 = protocol == "v1"
        ws = await websocket_connect(HTTPRequest(url, headers=self.headers, request_timeout=timeout),
                                     subprotocols=[V1_PROTOCOL] if v1 else None)
        if v1:
            assert ws.selected_subprotocol == V1_PROTOCOL, ws.selected_subprotocol
        msg_id = uuid.uuid4().hex
        request = {
            "header": {"msg_id": msg_id, "username": self.user, "session": uuid.uuid4().hex,
                       "msg_type": "execute_request", "version": "5.3", "date": ""},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": allow_stdin, "stop_on_error": True},
        }
        ws.write_message(to_v1(request) if v1 else json.dumps(request), binary=v1)
        output: list[str] = []
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                raw = await asyncio.wait_for(ws.read_message(), timeout=deadline - time.monotonic())
                assert raw is not None, "the kernel's websocket closed"
                msg = from_v1(raw) if v1 else json.loads(raw)
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                kind = msg.get("msg_type")
                if kind == "stream":
                    output.append(msg["content"]["text"])
                elif kind == "error":
                    raise AssertionError("the kernel raised:\n" + "\n".join(msg["content"]["traceback"]))
                elif kind == "status" and msg["content"]["execution_state"] == until:
                    return "".join(output)
                elif kind == "input_request" and until == "input_request":
                    return msg["content"]["prompt"]
            raise AssertionError(f"the kernel did not get to {until!r} in {timeout} s")
        finally:
            ws.close()
