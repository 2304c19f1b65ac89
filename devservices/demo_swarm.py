#!/usr/bin/env python3
"""`make demo-swarm`: the demo of `make demo` on a 2-node Docker Swarm made on this machine.

    .venv/bin/python devservices/demo_swarm.py

The same directory (seeded OpenLDAP), logins and profiles as `make demo`, but
the GPUs come from two GPU worker nodes (Docker-in-Docker dockerds with 2
simulated GPUs each, `gpu.model` a100 and t4) joined to a Swarm whose manager
is this machine's dockerd (devservices/swarm.py, as the tests use it), the
ledger is PostgreSQL, and the hub is `gpu-swarm`, running on the overlay
network in a helper container's network namespace.  The hub is at
http://127.0.0.1:8000 as in `make demo` (a forwarder to the hub's address).

Ctrl-C stops the hub and its servers, then removes the nodes, the overlay
and (if this demo made it one) leaves the swarm, then stops PostgreSQL and
the directory.  The ledger is thrown away with PostgreSQL; the homes stay in
.demo-swarm/homes/ (the shared storage every node mounts) for the next run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from devservices.demo import PY, Demo, DemoError, add_feature_arguments, say  # noqa: E402
from devservices.swarm import _docker0_gateway, start_hub_site, start_swarm, stop_swarm  # noqa: E402

SWARM_PROFILES = [
    {"slug": "tf-cpu", "display_name": "TensorFlow CPU (MKL/oneDNN)", "gpus": 0, "cpu_limit": 2.0,
     "mem_limit": "4G", "description": "CPU TensorFlow with the oneDNN (MKL) optimisations on. No GPU."},
    {"slug": "tf-gpu-1", "display_name": "TensorFlow + 1 GPU", "gpus": 1, "cpu_limit": 2.0, "mem_limit": "8G",
     "description": "One GPU of any node, lent to you alone."},
    {"slug": "tf-gpu-2", "display_name": "TensorFlow + 2 GPUs", "gpus": 2, "cpu_limit": 2.0, "mem_limit": "16G",
     "description": "Two GPUs of one node."},
    {"slug": "a100", "display_name": "TensorFlow + 1 A100", "gpus": 1, "cpu_limit": 2.0, "mem_limit": "8G",
     "node_labels": {"gpu.model": "a100"}, "description": "One GPU of the A100 node."},
]


class SwarmDemo(Demo):
    def __init__(self, args):
        super().__init__(args)
        self.swarm = None
        self.postgres = None
        self.forwarders: list[subprocess.Popen] = []

    def _forward(self, pairs: list[str], launcher: list[str] | None = None) -> None:
        proc = subprocess.Popen([*(launcher or []), PY, "-m", "devservices.forward", *pairs], cwd=REPO,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self.forwarders.append(proc)

    def start_hub(self, env: dict[str, str]) -> None:
        from devservices.ports import free_port
        from devservices.postgres import start_postgres

        say("making a 2-node Swarm (manager: this dockerd; 2 GPU workers with 2 simulated GPUs each)")
        self.swarm = start_swarm(session="demo", homes_root=self.dir / "homes")
        say(f"loading {env['GPUHUB_CPU_IMAGE']} into the worker nodes (docker save | docker load)")
        for image in {env["GPUHUB_CPU_IMAGE"], env["GPUHUB_GPU_IMAGE"]}:
            self.swarm.load_image(image)
        say("starting PostgreSQL (the ledger of a multi-host pool)")
        self.postgres = start_postgres()
        site = start_hub_site(self.swarm, env["GPUHUB_CPU_IMAGE"], 1)
        gateway = _docker0_gateway()
        # The hub's namespace reaches the host's loopback services at the same 127.0.0.1
        # addresses: host gateway forwarders, and loopback forwarders inside the namespace.
        pg_gw, ldap_gw, smtp_gw = free_port(), free_port(), free_port()
        self._forward([f"{gateway}:{pg_gw}", f"127.0.0.1:{self.postgres.port}",
                       f"{gateway}:{ldap_gw}", f"127.0.0.1:{self.args.ldap_port}",
                       f"{gateway}:{smtp_gw}", f"127.0.0.1:{self.args.smtp_port}"])
        self._forward([f"127.0.0.1:{self.postgres.port}", f"{gateway}:{pg_gw}",
                       f"127.0.0.1:{self.args.ldap_port}", f"{gateway}:{ldap_gw}",
                       f"127.0.0.1:{self.args.smtp_port}", f"{gateway}:{smtp_gw}"], site.launcher)
        self._forward([f"127.0.0.1:{self.args.port}", f"{site.bridge_ip}:{self.args.port}"])
        if env.get("GPUHUB_SSH", "").lower() in ("1", "true", "yes", "on"):
            # The gateway listens in the hub's namespace; `ssh -p PORT alice@127.0.0.1` reaches it here.
            ssh_port = env["GPUHUB_SSH_PORT"]
            env["GPUHUB_SSH_ADDRESS"] = site.bridge_ip
            self._forward([f"127.0.0.1:{ssh_port}", f"{site.bridge_ip}:{ssh_port}"])
        homes = self.swarm.homes_root
        profiles = self.dir / "profiles.json"
        profiles.write_text(json.dumps([{**p, "image": env["GPUHUB_GPU_IMAGE"] if p["gpus"] else
                                         env["GPUHUB_CPU_IMAGE"]} for p in SWARM_PROFILES], indent=1))
        env.update({
            "GPUHUB_SPAWNER": "swarm",
            "GPUHUB_INVENTORY": "swarm",
            "GPUHUB_POOL_DB_URL": self.postgres.url,
            "GPUHUB_HUB_CONNECT_IP": site.overlay_ip,
            "GPUHUB_BIND_URL": f"http://{site.bridge_ip}:{self.args.port}",
            "GPUHUB_DOCKER_NETWORK": self.swarm.network,
            "GPUHUB_PROFILES_FILE": str(profiles),
            "GPUHUB_SWARM_CPU_CONSTRAINTS": "node.labels.gpuhub.test-session==demo",
            "GPUHUB_SWARM_NODE_LABELS": "gpuhub.test-session=demo",
            "GPUHUB_SWARM_HOME_OPTIONS": json.dumps({"type": "none", "o": "bind", "device": f"{homes}/{{username}}"}),
            "GPUHUB_SWARM_HOMES_ROOT_OPTIONS": json.dumps({"type": "none", "o": "bind", "device": str(homes)}),
        })
        self.launcher = site.launcher
        super().start_hub(env)

    def stop(self) -> None:
        super().stop()
        for proc in self.forwarders:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)
        if self.swarm is not None:
            say("removing the Swarm's nodes and overlay")
            stop_swarm(self.swarm)
        if self.postgres is not None:
            self.postgres.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=REPO / ".demo-swarm",
                        help="where the demo keeps its data (default: .demo-swarm/)")
    parser.add_argument("--port", type=int, default=8000, help="the hub's port on 127.0.0.1")
    parser.add_argument("--ldap-port", type=int, default=3890)
    parser.add_argument("--ldaps-port", type=int, default=6360)
    add_feature_arguments(parser)
    try:
        return SwarmDemo(parser.parse_args(argv)).run()
    except DemoError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
