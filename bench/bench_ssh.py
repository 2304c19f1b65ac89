"""Benchmark: SSH through the hub's gateway vs `docker exec` / `docker cp` (the floor).

    .venv/bin/python bench/bench_ssh.py [--rounds 20] [--megabytes 100]

Starts a real hub with the gpu-ssh gateway (dummy login), starts one user's server, then,
in the same run, side by side: `ssh user@hub true` (a fresh connection each time: TCP,
key exchange, password login, the gateway's connection to the container's sshd, the
command) against `docker exec CONTAINER true`; and `scp` of a file of random bytes into
the home against `docker cp` of the same file.  Prints a table (medians, ratio vs the
floor); asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import environment, percentile  # noqa: E402
from devservices.hub import DUMMY_PASSWORD, cleanup_hub, prepare_hub  # noqa: E402
from devservices.ssh_client import SSHClient, ssh_env, wait_for_gateway  # noqa: E402


def cipher_rates(megabytes: int = 50) -> dict[str, float]:
    """MB/s at which asyncssh (the gateway's SSH) encrypts 32 KB packets with each cipher it could offer."""
    from asyncssh.encryption import get_encryption, get_encryption_params

    data = os.urandom(32768)
    rates = {}
    for alg in (b"chacha20-poly1305@openssh.com", b"aes128-gcm@openssh.com", b"aes256-gcm@openssh.com"):
        key_size, iv_size = get_encryption_params(alg, b"")[:2]
        enc = get_encryption(alg, os.urandom(key_size), os.urandom(iv_size), b"", b"")
        n = megabytes * 32
        began = time.perf_counter()
        for seq in range(n):
            enc.encrypt_packet(seq, b"\0\0\0\0", data)
        rates[alg.decode()] = n * 32768 / (time.perf_counter() - began) / 1e6
    return rates


def timed(argv: list[str]) -> float:
    began = time.monotonic()
    subprocess.run(argv, check=True, capture_output=True, timeout=600)
    return time.monotonic() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--copies", type=int, default=5, help="rounds of the file copies")
    args = parser.parse_args()

    client, image, network = environment(os.environ.get("GPUHUB_BENCH_IMAGE"))
    directory = Path(tempfile.mkdtemp(prefix="bench-ssh-"))
    env = ssh_env()
    hub = prepare_hub(directory, image, network, env=env).start()
    port = int(env["GPUHUB_SSH_PORT"])
    try:
        wait_for_gateway(port, hub)
        hub.create_user("bench")
        hub.start_server("bench")
        (container,) = [c for c in hub.containers(client, all=False) if c.name.endswith("-bench")]
        ssh = SSHClient(port, directory / "ssh")
        first = ssh.ssh("bench", "true", password=DUMMY_PASSWORD)  # accepts the host key
        assert first.returncode == 0, first.stderr
        exec_s, ssh_s = [], []
        for _ in range(args.rounds):
            exec_s.append(timed(["docker", "exec", container.name, "true"]))
            r = ssh.ssh("bench", "true", password=DUMMY_PASSWORD)
            assert r.returncode == 0, r.stderr
            ssh_s.append(r.seconds)
        blob = directory / "blob.bin"
        with open(blob, "wb") as f:
            f.write(os.urandom(args.megabytes * 1024 * 1024))
        cp_s, scp_s = [], []
        for _ in range(args.copies):
            cp_s.append(timed(["docker", "cp", str(blob), f"{container.name}:/tmp/blob-cp.bin"]))
            r = ssh.scp("bench", blob, "blob-scp.bin", password=DUMMY_PASSWORD, timeout=600)
            assert r.returncode == 0, r.stderr
            scp_s.append(r.seconds)
        check = ssh.ssh("bench", "stat -c %s blob-scp.bin", password=DUMMY_PASSWORD)
        assert check.stdout.strip() == str(blob.stat().st_size), check
    finally:
        cleanup_hub(hub, client)

    print()
    print(f"SSH through the hub's gateway vs docker (real hub, dockerd, OpenSSH client; {os.cpu_count()} cores)")
    print(f"{'what':<36} {'runs':>5} {'median s':>9} {'p90 s':>7} {'MB/s':>7} {'vs floor':>9}")
    rows = (("docker exec CONTAINER true (floor)", exec_s, None, statistics.median(exec_s)),
            ("ssh user@hub true", ssh_s, None, statistics.median(exec_s)),
            (f"docker cp {args.megabytes} MB (floor)", cp_s, args.megabytes, statistics.median(cp_s)),
            (f"scp {args.megabytes} MB into the home", scp_s, args.megabytes, statistics.median(cp_s)))
    for name, values, mb, floor in rows:
        med = statistics.median(values)
        rate = f"{mb / med:7.1f}" if mb else f"{'':>7}"
        print(f"{name:<36} {len(values):>5} {med:>9.3f} {percentile(values, 0.9):>7.3f} {rate} {med / floor:>8.2f}x")
    rates = cipher_rates()
    base = rates["chacha20-poly1305@openssh.com"]
    print()
    print("The gateway's cipher: asyncssh encrypting 32 KB packets (why it offers AES-GCM only)")
    print(f"{'cipher':<32} {'MB/s':>7} {'vs chacha20':>12}")
    for name, rate in rates.items():
        print(f"{name:<32} {rate:>7.0f} {rate / base:>11.2f}x")


if __name__ == "__main__":
    main()
