"""GPU-aware idle culling: jupyterhub-idle-culler with a cull arbiter that knows leases.

Three pieces, one job (give idle GPUs back without killing busy work):

- `GPUCullPolicy` decides, for one server model from the hub's REST API,
  whether to cull it.  GPU servers (their state carries a `gpu_lease_id`)
  get `gpu_timeout` seconds of inactivity, CPU servers `cpu_timeout`.  An
  optional rule culls a GPU server whose leased GPUs all stayed under
  `gpu_idle_percent` for `gpu_idle_seconds`, whatever its activity says.
  It and the culler's utilisation reader live in policy.py, which needs
  neither jupyterhub-idle-culler nor tornado (bench/device_check.py runs it
  on a bare GPU machine).
- `GPUIdleCuller` is jupyterhub-idle-culler's own application with the policy
  installed as its `cull_arbiter_hook` (a config-only Callable upstream, so it
  cannot be given on a command line); `python -m spawner.culling` runs it.
- `spawner.settings.culler.configure_culler(c, settings)` adds it to the hub
  as the managed service `idle-culler` with a role of only the scopes it uses,
  and makes the single-user servers report a busy kernel as activity (see below).

Why the single-user side needs help: jupyter-server counts kernel *messages*
as activity, not a kernel being busy, so a cell that sleeps or computes
without printing looks idle and the stock culler kills it (upstream
jupyterhub-idle-culler#55).  The notebook images carry a jupyter-server
extension, `gpuhub_activity` (images/jupyter/), that counts a working kernel
as activity through jupyter-server's documented `*_last_activity` settings
hook, but not a kernel that only waits for a person (an `input()` or pdb
prompt, a debugger stopped at a breakpoint).  The image's own start command
stays as it is; `gpu-pool doctor` warns about a profile image without the
extension.

Before the culler stops a GPU server it records its intent in the ledger
(`record_cull`); the spawner reads it when the stop arrives and ends the lease
with reason `culled`; the GPU is free the moment the lease ends.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traitlets import CaselessStrEnum, Float, Int, Unicode, default

# The policy and the culler's utilisation reader live in policy.py (no culler, no tornado);
# the deadline rule the pages share with it in deadline.py.
from ..inventory.machine import SimulatedInventory
from .deadline import CullRules
from .policy import (  # noqa: F401
    DEFAULT_GPU_IDLE_PERCENT,
    DEFAULT_GPU_IDLE_SECONDS,
    CullerUtilization,
    GPUCullPolicy,
    LedgerBookings,
    LedgerBudgets,
    LedgerContention,
    Verdict,
)

if TYPE_CHECKING:
    from ..pool import GPUPool


SERVICE_NAME = "idle-culler"

# Exactly what the culler reads or does, nothing more:
#   list:users            GET /users (with ?state=ready)
#   read:users:activity   last_activity of users and their servers
#   read:servers          the servers in each user model
#   delete:servers        DELETE /users/:name/server(s/:server)
#   admin:server_state    the spawner state in the server model: is it a GPU server?

# The name under which busy kernels show up in jupyter-server's activity
# (any web_app setting ending in `_last_activity` counts); the same in the
# images' extension (images/jupyter/gpuhub_activity) and the wrapper below.
BUSY_ACTIVITY_SETTING = "gpuhub_busy_kernels_last_activity"
# The container environment variable that turns the extension off.
BUSY_SWITCH_ENV = "GPUHUB_BUSY_KERNELS_ACTIVITY"
# The container environment variable with the quiet spell (seconds) after which the images'
# extension posts new activity to the hub at once, not at its next periodic report.
QUIET_ENV = "GPUHUB_ACTIVITY_QUIET_AFTER"

# ------------------------------------------------------------ the culler app


def _load_idle_culler():
    from jupyterhub_idle_culler import IdleCuller

    return IdleCuller


IdleCuller: Any = _load_idle_culler()  # jupyterhub-idle-culler ships no type information


class GPUIdleCuller(IdleCuller):
    """jupyterhub-idle-culler, with GPU servers on a shorter leash than CPU servers."""

    name = "gpuhub-idle-culler"

    cpu_timeout = Int(
        3600,
        help="Seconds a CPU server (no GPU lease) may stay inactive before it is culled.",
    ).tag(config=True)

    gpu_timeout = Int(
        900,
        help="Seconds a GPU server (its state holds a GPU lease) may stay inactive before it is "
        "culled.  Usually shorter than `cpu_timeout`: an idle GPU blocks a colleague.",
    ).tag(config=True)

    gpu_contended_timeout = Int(
        300,
        help="Seconds a GPU server may stay inactive while a request waits for GPUs on its host (read "
        "from the ledger named by GPUHUB_POOL_DB_URL; without a ledger nobody is known to wait and it "
        "never applies).  Shorter than `gpu_timeout`: an idle GPU then keeps someone waiting.  0 turns "
        "it off; when nobody waits, `gpu_timeout` holds.",
    ).tag(config=True)

    profile_limits = Unicode(
        "",
        help="Per-profile idle limits and maximum ages as JSON (deadline.CullRules.to_json), written "
        "by the hub from its profiles' `idle_timeout` and `max_age`.",
    ).tag(config=True)

    gpu_idle_percent = Float(
        DEFAULT_GPU_IDLE_PERCENT,
        help="Cull a GPU server whose leased GPUs all read under this utilization (percent) for "
        "`gpu_idle_seconds`, even when it shows activity (an open browser tab, a kernel blocked on "
        "a prompt).  0 turns the rule off.  Default: 5 with the `nvml` and `swarm` inventories (real "
        "GPUs), 0 (off) with `simulated` and `static`.",
    ).tag(config=True)

    @default("gpu_idle_percent")
    def _default_gpu_idle_percent(self):
        return DEFAULT_GPU_IDLE_PERCENT if self.inventory in ("nvml", "swarm") else 0.0

    gpu_idle_seconds = Float(
        DEFAULT_GPU_IDLE_SECONDS,
        help="How long the GPUs must stay under `gpu_idle_percent` before the server is culled.  "
        "Utilization is sampled once per `cull_every`, which bounds the precision.",
    ).tag(config=True)

    inventory = CaselessStrEnum(
        ["nvml", "static", "simulated", "swarm"],
        default_value="nvml",
        help="Where GPU utilization is read: `nvml` (the NVIDIA driver on this machine), "
        "`swarm` (the per-node agents' readings in the ledger named by the GPUHUB_POOL_DB_URL "
        "environment variable), `simulated` (the file in `utilization_file`), `static` (unknown: "
        "the GPU rule never fires).",
    ).tag(config=True)

    reading_max_age = Float(
        60.0,
        help="With the `swarm` inventory: seconds an agent's reading counts as live (as "
        "SwarmInventory.reading_max_age in the hub); older readings are unknown and never cull.",
    ).tag(config=True)

    simulated_gpus = Int(
        SimulatedInventory.count.default_value,
        help="Number of simulated GPUs (as SimulatedInventory.count in the hub).",
    ).tag(config=True)

    utilization_file = Unicode(
        "",
        help="For the simulated inventory: the JSON file holding each GPU's utilization (the format of "
        "`SimulatedInventory.utilization_file`: {uuid: percent} or {uuid: {\"utilization\": percent, ...}}).",
    ).tag(config=True)

    aliases = {
        **IdleCuller.aliases,
        "cpu-timeout": "GPUIdleCuller.cpu_timeout",
        "gpu-timeout": "GPUIdleCuller.gpu_timeout",
        "gpu-contended-timeout": "GPUIdleCuller.gpu_contended_timeout",
        "profile-limits": "GPUIdleCuller.profile_limits",
        "gpu-idle-percent": "GPUIdleCuller.gpu_idle_percent",
        "gpu-idle-seconds": "GPUIdleCuller.gpu_idle_seconds",
        "inventory": "GPUIdleCuller.inventory",
        "simulated-gpus": "GPUIdleCuller.simulated_gpus",
        "utilization-file": "GPUIdleCuller.utilization_file",
        "reading-max-age": "GPUIdleCuller.reading_max_age",
    }

    @default("cull_every")
    def _default_cull_every(self):
        # Upstream's default is half the timeout; a GPU server's deadline and the contended limit
        # want a round every minute (a round is one page of the hub's users API).
        return 60

    @default("timeout")
    def _default_timeout(self):
        # The arbiter decides with the rules (culling/deadline.py); this is the shortest of them.
        return int(self.rules().shortest)

    def rules(self) -> CullRules:
        if self.profile_limits:
            rules = CullRules.from_json(self.profile_limits)
            return CullRules(self.cpu_timeout, self.gpu_timeout, self.gpu_contended_timeout, rules.profile_idle,
                             rules.profile_max_age)
        return CullRules(self.cpu_timeout, self.gpu_timeout, self.gpu_contended_timeout)

    @default("cull_arbiter_hook")
    def _default_arbiter(self):
        utilization = None
        if self.gpu_idle_percent > 0 and self.inventory != "static":
            utilization = CullerUtilization(self.inventory, self.simulated_gpus, self.utilization_file, self.log,
                                       self.reading_max_age)
        from ..pool import ENV_DB_URL, GPUPool, ledger_env

        contention = over_budget = booked_out = None
        url = ledger_env(ENV_DB_URL)
        if url:
            # The ledger: who waits (the contended timeout) and the budgets (its lending hub's).
            if self._ledger is None:
                self._ledger = GPUPool(db_url=url, log=self.log)
            if self.gpu_contended_timeout > 0:
                contention = LedgerContention(self._ledger.queue, self.log)
            over_budget = LedgerBudgets(self._ledger, self.log)
            booked_out = LedgerBookings(self._ledger, self.log)
        elif "gpu_contended_timeout" in self.config.get("GPUIdleCuller", {}) and self.gpu_contended_timeout > 0:
            self.log.warning("gpu_contended_timeout is set but %s is not: the usual idle limits hold", ENV_DB_URL)
        return GPUCullPolicy(
            rules=self.rules(),
            contention=contention,
            over_budget=over_budget,
            booked_out=booked_out,
            cpu_timeout=self.cpu_timeout,
            gpu_timeout=self.gpu_timeout,
            gpu_idle_percent=self.gpu_idle_percent,
            gpu_idle_seconds=self.gpu_idle_seconds,
            utilization=utilization,
            log=self.log,
            on_cull=self.record_cull,
        )

    async def record_cull(self, server: dict, reason: str = "culled") -> None:
        """Note in the ledger, before the DELETE, that this GPU server is being culled, and why.

        JupyterHub tells a spawner nothing of who stopped it: the spawner reads this intent
        when the stop arrives and ends the lease `culled` (or `budget`, when its user's GPU-hours
        ran out; without an intent: `stopped`)."""
        lease_id = (server.get("state") or {}).get("gpu_lease_id")
        if lease_id is None:
            return  # a CPU server: no lease to end
        from ..pool import ENV_DB_URL, GPUPool, ledger_env

        url = ledger_env(ENV_DB_URL)
        if not url:
            self.log.warning("%s is not set: the cull of GPU lease %s ends it as `stopped`", ENV_DB_URL, lease_id)
            return
        try:
            if self._ledger is None:
                self._ledger = GPUPool(db_url=url, log=self.log)
            await asyncio.to_thread(self._ledger.record_end_intent, lease_id, reason, SERVICE_NAME)
        except Exception as exc:  # the cull goes ahead; its lease then ends as `stopped`
            self.log.warning("Could not record the cull of GPU lease %s in the ledger: %s", lease_id, exc)

    _ledger: GPUPool | None = None


    def start(self):
        # The hub hands the culler its options as a file of config sections (settings/culler.py);
        # upstream skips a file it cannot find, and a culler on defaults would cull by the wrong rules.
        given = any("config_file" in self.config.get(section, {}) for section in ("IdleCuller", "GPUIdleCuller"))
        if given and self.config_file:
            path = Path(self.config_file)
            if not path.is_file():
                self.log.critical("The culler's settings file %s is missing: the hub writes it at its start", path)
                self.exit(1)
        self._stop_on_signals()
        super().start()

    def _stop_on_signals(self) -> None:
        """Exit promptly on SIGINT and SIGTERM.

        JupyterHub stops its services with SIGINT and waits 30 s before it
        sends SIGTERM.  A hub started with SIGINT ignored (from a background
        job of a shell script, by some process managers) passes that on to
        its services, and Python then never raises KeyboardInterrupt: the hub
        waited out the culler at every shutdown.  Handlers installed here
        replace an inherited "ignore" and stop the event loop cleanly.
        """
        from tornado.ioloop import IOLoop
        from tornado.platform.asyncio import BaseAsyncIOLoop

        current = IOLoop.current()
        if not isinstance(current, BaseAsyncIOLoop):  # tornado >= 5 runs every IOLoop on asyncio
            raise RuntimeError(f"The culler needs tornado's asyncio IOLoop, not {type(current).__name__}")
        loop = current.asyncio_loop

        def stop(sig: signal.Signals) -> None:
            self.log.info("Received %s: the culler stops", sig.name)
            loop.stop()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop, sig)
        from ..services.lifecycle import stop_when_the_hub_is_gone

        self._watchdog = loop.create_task(stop_when_the_hub_is_gone("idle-culler", self.log))


def main(argv: list[str] | None = None) -> None:
    GPUIdleCuller.launch_instance(argv)


if __name__ == "__main__":
    main()
