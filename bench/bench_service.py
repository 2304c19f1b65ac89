#!/usr/bin/env python3
"""The gpu-pool service's threads and memory after many requests, on a real hub and dockerd.

    .venv/bin/python bench/bench_service.py [--views 200] [--drops 50] [--image IMG]

Starts a hub (with its gpu-pool service and jobs), runs a CPU job that prints a line every
0.2 s, and measures the service process's threads and resident memory (RSS): before; after
`--views` views of the pool page and api/wait, alternating; and after `--drops` readers that
follow the job's log (`logs?follow=1`), read its first line and go away.  Each "after" is
read once the service has had 5 s to end what the requests left behind.  Prints a table.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import environment  # noqa: E402
from devservices.hub import cleanup_hub, prepare_hub, wait_for  # noqa: E402

SETTLE_S = 5.0
TICKING = ["sh", "-c", "while :; do echo tick; sleep 0.2; done"]


def service_pid(hub) -> int:
    def find():
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == hub.process.pid and \
                        b"spawner.poolpage" in Path(f"/proc/{entry}/cmdline").read_bytes():
                    return int(entry)
            except OSError:
                pass
        return None
    return wait_for(find, what="the gpu-pool service")


def measure(pid: int) -> tuple[int, float]:
    """(threads, RSS in MiB) of process `pid`."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return len(os.listdir(f"/proc/{pid}/task")), rss / 1024


def page(hub, path: str, token: str):
    import requests

    return requests.get(f"{hub.url}/services/gpu-pool/{path}", headers={"Authorization": f"token {token}"},
                        timeout=60)


def dropped_follower(hub, token: str, job_id: int) -> int:
    """Follow the job's log, read its first line, go away; the HTTP status."""
    address = urlparse(hub.url)
    sock = socket.create_connection((address.hostname, address.port), timeout=60)
    try:
        sock.sendall(f"GET /services/gpu-pool/api/jobs/{job_id}/logs?follow=1 HTTP/1.1\r\n"
                     f"Host: {address.hostname}\r\nAuthorization: token {token}\r\n\r\n".encode())
        got = b""
        while not (b"\r\n\r\n" in got and (not got.startswith(b"HTTP/1.1 200") or b"tick" in got)):
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        return int(got.split(b" ", 2)[1]) if got else 0
    finally:
        sock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--views", type=int, default=200)
    parser.add_argument("--drops", type=int, default=50)
    parser.add_argument("--image", default=None)
    args = parser.parse_args()
    client, image, network = environment(args.image)
    with tempfile.TemporaryDirectory() as tmp:
        hub = prepare_hub(Path(tmp), image, network)
        try:
            hub.start()
            hub.create_user("bench")
            token = hub.user_token("bench")
            wait_for(lambda: page(hub, "api/gpus", token).status_code == 200, what="the service")
            page(hub, "", token)  # warm: templates, thread pools
            import requests

            job = requests.post(f"{hub.url}/services/gpu-pool/api/jobs", timeout=60,
                                headers={"Authorization": f"token {token}"},
                                json={"profile": "tf-cpu", "command": TICKING}).json()
            wait_for(lambda: "tick" in page(hub, f"api/jobs/{job['id']}/logs", token).text, timeout=120,
                     what="the job's output")
            pid = service_pid(hub)
            time.sleep(SETTLE_S)
            rows = [("before", *measure(pid), "")]
            t0 = time.perf_counter()
            statuses = [page(hub, ("", "api/wait")[i % 2], token).status_code for i in range(args.views)]
            took = time.perf_counter() - t0
            time.sleep(SETTLE_S)
            rows.append((f"after {args.views} page views", *measure(pid),
                         f"{statuses.count(200)} x 200, {took / args.views * 1000:.0f} ms each"))
            codes = [dropped_follower(hub, token, job["id"]) for _ in range(args.drops)]
            time.sleep(SETTLE_S)
            rows.append((f"after {args.drops} dropped log streams", *measure(pid),
                         ", ".join(f"{codes.count(c)} x {c}" for c in sorted(set(codes)))))
        finally:
            cleanup_hub(hub, client)
    print(f"\nThe gpu-pool service's process (each row read {SETTLE_S:g} s after the requests)\n")
    print(f"| {'':<28} | {'threads':>7} | {'RSS MiB':>7} | {'answers':<28} |")
    print(f"|{'-' * 30}|{'-' * 9}|{'-' * 9}|{'-' * 30}|")
    for name, n, rss, note in rows:
        print(f"| {name:<28} | {n:>7} | {rss:>7.1f} | {note:<28} |")


if __name__ == "__main__":
    main()
