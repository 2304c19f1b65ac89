"""`gpu-pool`: look at and administer the GPU lease ledger.

    gpu-pool [--db-url URL | --config jupyterhub_config.py] [--json] COMMAND

Commands: status, leases, history, queue, drain UUID, undrain UUID,
rehome OLD NEW, release LEASE_ID, doctor (checks this GPU host; exit 1
when a check failed; see spawner/cli/doctor.py), agent (the per-node agent that
reports this node's GPU utilisation to the ledger until SIGTERM; see
spawner/cli/agent.py), and exec (an action script in
running servers, through the hub's gpu-pool service; exit 3 when it failed
somewhere).  The ledger is found, first match wins, from --db-url, the
GPUHUB_POOL_DB_URL environment variable (GPU_POOL_DB_URL, its old name, still works),
c.GPUPool.db_url in --config, else by the hub's own rule (spawner.settings.hub.ledger_url):
gpu-pool.sqlite in GPUHUB_DATA_DIR (the current directory when unset).
--env-file FILE reads the hub's settings file first, as its systemd unit does.
With --config, a relative SQLite path is read relative to the config file's
directory (where the hub normally runs).

Exit status: 0 done, 1 the ledger is unavailable, 2 bad input (unknown GPU or
lease, bad date, bad config).  Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

from sqlalchemy.engine import make_url
from traitlets import TraitError
from traitlets.config import Config, PyFileConfigLoader

from ..pool import (
    ENV_DB_URL,
    ENV_DB_URL_FILE,
    EndReason,
    GPUPool,
    GPUStatus,
    Lease,
    PoolError,
    PoolUnavailable,
    ledger_env,
)
from ..pool.validation import FIRST_TIME, LAST_TIME, TimeOutOfRange, iso_time

# Where `gpu-pool agent` reads its node's GPUs; its options' defaults may come from the
# environment (a Swarm service's, in the stack file).
AGENT_INVENTORIES = ("nvml", "static", "simulated")


class CLIError(Exception):
    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not argparse's usage block.
        raise CLIError(f"{message} (see gpu-pool --help)")


def _parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)  # a _Parser: the subparsers take parents of their own class
    common.add_argument("--db-url", default=argparse.SUPPRESS, help=f"ledger database URL (or set {ENV_DB_URL})")
    common.add_argument("--config", default=argparse.SUPPRESS, metavar="PATH",
                        help="a jupyterhub_config.py to read c.GPUPool from")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print JSON for scripts instead of tables")
    common.add_argument("--env-file", default=argparse.SUPPRESS, metavar="PATH",
                        help="read the hub's settings file (e.g. /etc/jupyterhub-gpu/gpuhub.env) as its "
                             "systemd unit does; its values win over this shell's environment")

    parser = _Parser(prog="gpu-pool", description="Look at and administer the GPU lease ledger.",
                     parents=[common])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.add_parser("status", parents=[common], help="each GPU: state, holder, since")
    p = sub.add_parser("leases", parents=[common], help="active leases")
    p.add_argument("--user")
    p.add_argument("--host")
    p = sub.add_parser("history", parents=[common], help="all leases in a period, with GPU-hours per user and group")
    p.add_argument("--user")
    p.add_argument("--since", help="start of the period (ISO date or datetime, UTC unless it has a zone)")
    p.add_argument("--until", help="end of the period (default: now)")
    sub.add_parser("queue", parents=[common], help="requests waiting for GPUs, in the order they are served")
    p = sub.add_parser("book", parents=[common], help="book GPUs for a user or a group over a time window")
    p.add_argument("--user", help="who the booking is for (default: you)")
    p.add_argument("--group", help="book for this group's members (a course, a deadline)")
    p.add_argument("--count", type=int, default=1, help="how many GPUs of one host (1)")
    p.add_argument("--start", required=True, help="the window's start (ISO date-time, UTC unless it has a zone)")
    p.add_argument("--end", required=True, help="the window's end")
    p.add_argument("--host", help="book on this host (default: any with room)")
    sub.add_parser("bookings", parents=[common], help="bookings not yet over")
    p = sub.add_parser("unbook", parents=[common], help="cancel a booking")
    p.add_argument("booking_id", type=int)
    sub.add_parser("fairshare", parents=[common],
                   help="every user's and group's recent (decayed) GPU use, share and priority, like sshare")
    for name, what in (("drain", "stop lending a GPU (its current lease runs on)"), ("undrain", "lend a GPU again")):
        p = sub.add_parser(name, parents=[common], help=what)
        p.add_argument("uuid")
        p.add_argument("--host", help="the GPU's host, when its uuid is listed on several")
    p = sub.add_parser("rehome", parents=[common],
                       help="give a renamed host's GPUs and active leases its new name (hub stopped)")
    p.add_argument("old_host")
    p.add_argument("new_host")
    p = sub.add_parser("doctor", parents=[common],
                       help="check this GPU host: NVML, GPUs, Docker and its NVIDIA devices, images, ledger, data dir")
    p.add_argument("--hub-user", default=None, help="the user the hub runs as (default: you)")
    p = sub.add_parser("exec", parents=[common],
                       help="run a script in every running server of a profile, group or list of users "
                            "(as each server's user, through the gpu-pool service)")
    p.add_argument("script", metavar="SCRIPT", help="a file with the script, or - for standard input")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--profile", help="the servers of this profile (its slug)")
    target.add_argument("--group", help="the servers of this group's members")
    target.add_argument("--users", help="the servers of these users (comma-separated)")
    p.add_argument("--timeout", type=int, default=60, help="seconds the script may run in each server (60)")
    p.add_argument("--hub-url", default=os.environ.get("JUPYTERHUB_URL", "http://127.0.0.1:8000"),
                   help="the hub's public URL (JUPYTERHUB_URL; default http://127.0.0.1:8000)")
    p.add_argument("--token", default=os.environ.get("JUPYTERHUB_API_TOKEN", ""),
                   help="a hub API token with custom:gpu-pool:exec (JUPYTERHUB_API_TOKEN)")
    p = sub.add_parser("agent", parents=[common],
                       help="report this node's GPU utilisation to the ledger every --interval s (until SIGTERM)")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between readings (10)")
    p.add_argument("--inventory", default=os.environ.get("GPUHUB_AGENT_INVENTORY", "").strip() or "nvml",
                   choices=AGENT_INVENTORIES,
                   help="where this node's GPUs are read (GPUHUB_AGENT_INVENTORY; default nvml)")
    p.add_argument("--host", help="this node's name in the ledger: its Swarm node hostname (default: hostname)")
    p.add_argument("--db-url-file", default=ledger_env(ENV_DB_URL_FILE) or None,
                   help=f"a file holding the ledger URL, e.g. a Docker secret (or set {ENV_DB_URL_FILE})")
    p.add_argument("--simulated-gpus", type=int, default=os.environ.get("GPUHUB_SIMULATED_GPUS", "").strip() or None,
                   help="simulated inventory: how many GPUs (GPUHUB_SIMULATED_GPUS)")
    p.add_argument("--utilization-file", default=os.environ.get("GPUHUB_SIMULATED_UTILIZATION_FILE") or None,
                   help="simulated inventory: the JSON file {uuid: percent or {\"utilization\", \"memory_used_mib\"}} "
                        "(GPUHUB_SIMULATED_UTILIZATION_FILE)")
    p = sub.add_parser("release", parents=[common], help="end a lease (the server keeps running without it!)")
    p.add_argument("lease_id", type=int)
    p.add_argument("--reason", default=EndReason.ADMIN.value, choices=[r.value for r in EndReason])
    return parser


# --- building the pool ------------------------------------------------------


def load_env_file(path: str | None) -> list[tuple[int, str, str]]:
    """Put the settings of the file at `path` into this process's environment, as the hub's
    unit would get them; the lines a shell would read differently (see settings.envfile)."""
    if not path:
        return []
    from ..settings import SettingsError
    from ..settings.envfile import read_env_file

    try:
        values, problems = read_env_file(path)
    except SettingsError as e:
        raise CLIError(f"--env-file: {e}") from None
    os.environ.update(values)
    return problems


def load_config(config_path: str | None) -> tuple[Config, str | None]:
    """The traitlets config in `config_path` (empty without one) and its directory."""
    if not config_path:
        return Config(), None
    path = os.path.abspath(config_path)
    if not os.path.isfile(path):
        raise CLIError(f"No config file at {path}")
    try:
        loader = PyFileConfigLoader(os.path.basename(path), path=os.path.dirname(path))
        config = loader.load_config()
    except SystemExit as e:  # jupyterhub_config.py exits with one line on a bad GPUHUB_* setting
        raise CLIError(f"Cannot load {path}: {e.code}") from None
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise CLIError(f"Cannot load {path}: {type(e).__name__}: {first}") from None
    return config, os.path.dirname(path)


def absolute_sqlite_url(url: str, base_dir: str | None) -> str:
    """A relative SQLite path made absolute, relative to `base_dir` (default: the current directory)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return url
    if os.path.isabs(parsed.database):
        return url
    path = os.path.join(base_dir or os.getcwd(), parsed.database)
    return parsed.set(database=path).render_as_string(hide_password=False)


def build_pool(db_url: str | None = None, config_path: str | None = None) -> GPUPool:
    """The GPUPool the options point at (see the module docstring for the order)."""
    from ..settings.hub import ledger_url

    config, base_dir = load_config(config_path)
    url = db_url or ledger_env(ENV_DB_URL)
    found_by = "--db-url" if db_url else ENV_DB_URL
    if url:
        config.GPUPool.db_url = url
        base_dir = None  # a URL given here is relative to the current directory
    elif config.GPUPool.get("db_url", None):
        found_by = f"c.GPUPool.db_url in {config_path}"
    else:
        # The hub's own rule: the file GPUHUB_POOL_DB_URL_FILE names, else gpu-pool.sqlite in GPUHUB_DATA_DIR.
        from ..settings import SettingsError

        try:
            config.GPUPool.db_url = ledger_url(os.environ)
        except SettingsError as e:
            raise CLIError(str(e)) from None
        found_by = (ENV_DB_URL_FILE if ledger_env(ENV_DB_URL_FILE) else
                    "GPUHUB_DATA_DIR" if os.environ.get("GPUHUB_DATA_DIR", "").strip() else
                    "GPUHUB_DATA_DIR unset: the current directory")
        base_dir = None
    try:
        pool = GPUPool(config=config)
    except TraitError as e:
        raise CLIError(str(e)) from None
    pool.db_url = absolute_sqlite_url(pool.db_url, base_dir)
    parsed = make_url(pool.db_url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        path = parsed.database
        if not os.path.exists(path):
            # Never create an empty ledger by accident: `status` would show no GPUs.
            raise CLIError(
                f"No GPU ledger at {path} ({found_by}); the hub makes it at its first start. Read the "
                "hub's settings (gpu-pool --env-file /etc/jupyterhub-gpu/gpuhub.env COMMAND), or pass "
                "--db-url", code=1
            )
    return pool


# --- formatting -------------------------------------------------------------


def _time(value: datetime | None) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ") if value else "-"


def _server(name: str) -> str:
    return name or "(default)"


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def _status_text(statuses: list[GPUStatus], counts: dict, waiting: int) -> str:
    rows = []
    for s in statuses:
        state = s.state
        if s.lease and s.lease.problem:
            state = f"lent (stuck: {s.lease.problem})"
        elif s.lease and s.drained:
            state = "lent (draining)"
        elif state == "lent" and not s.present:
            state = "lent (missing)"
        rows.append([
            s.gpu.host, s.gpu.index, s.gpu.uuid, state,
            s.lease.user if s.lease else "-",
            _server(s.lease.server_name) if s.lease else "-",
            s.lease.id if s.lease else "-",
            _time(s.lease.started_at if s.lease else s.drained_at if s.drained else None),
        ])
    if not rows:
        return "No GPUs in the ledger yet (the hub records them when it starts)."
    summary = (
        f"{len(statuses)} GPUs: {counts['free']} free, {counts['lent']} lent, {counts['drained']} drained; "
        f"{waiting} request(s) waiting"
    )
    return _table(["HOST", "INDEX", "UUID", "STATE", "USER", "SERVER", "LEASE", "SINCE"], rows) + "\n" + summary


def _leases_text(leases: list[Lease], with_end: bool = False) -> str:
    headers = ["ID", "USER", "SERVER", "HOST", "GPUS", "GROUPS", "STARTED"]
    if with_end:
        headers += ["ENDED", "REASON", "GPU-HOURS"]
    rows = []
    for l in leases:
        row = [l.id, l.user, _server(l.server_name), l.host, ",".join(l.gpu_uuids), ",".join(l.groups) or "-",
               _time(l.started_at)]
        if with_end:
            row += [_time(l.ended_at) if l.ended_at else "(active)", l.end_reason or "-", f"{l.gpu_hours():.2f}"]
        rows.append(row)
    return _table(headers, rows)


def _parse_time(value: str | None, what: str) -> datetime | None:
    if value is None:
        return None
    try:
        return iso_time(value)
    except TimeOutOfRange:
        raise CLIError(f"--{what} {value!r} is outside the times the pool answers for ({FIRST_TIME:%Y-%m-%d} to "
                       f"{LAST_TIME:%Y-%m-%d} UTC)") from None
    except ValueError:
        raise CLIError(f"--{what} {value!r} is not an ISO date or datetime (like 2024-05-01 or 2024-05-01T08:00)") \
            from None


# --- commands -----------------------------------------------------------------


def _run(args, pool: GPUPool, out) -> int:
    as_json = getattr(args, "json", False)

    def emit(text: str, data: Any) -> None:
        print(json.dumps(data, indent=2) if as_json else text, file=out)

    if args.command == "status":
        statuses, counts, queue = pool.gpus(), pool.counts(), pool.queue()
        emit(
            _status_text(statuses, counts, len(queue)),
            {"gpus": [s.to_dict() for s in statuses], "counts": counts, "queue": [w.to_dict() for w in queue]},
        )
    elif args.command == "leases":
        leases = pool.leases(user=args.user, host=args.host)
        emit(_leases_text(leases) if leases else "No active leases.", [l.to_dict() for l in leases])
    elif args.command == "history":
        since, until = _parse_time(args.since, "since"), _parse_time(args.until, "until")
        if since and until and since >= until:
            raise CLIError("--since must be before --until")
        leases = pool.history(user=args.user, since=since, until=until)
        usage = pool.usage(since=since, until=until)
        if args.user:
            usage["users"] = {u: h for u, h in usage["users"].items() if u == args.user}
            groups = {g for l in leases for g in l.groups}
            usage["groups"] = {g: h for g, h in usage["groups"].items() if g in groups}
        parts = [_leases_text(leases, with_end=True) if leases else "No leases in this period."]
        if usage["users"]:
            parts.append("\nGPU-hours per user:\n" + _table(
                ["USER", "GPU-HOURS"], [[u, f"{h:.2f}"] for u, h in sorted(usage["users"].items())]))
        if usage["groups"]:
            parts.append("\nGPU-hours per group:\n" + _table(
                ["GROUP", "GPU-HOURS"], [[g, f"{h:.2f}"] for g, h in sorted(usage["groups"].items())]))
        emit("\n".join(parts), {
            "since": since.isoformat() if since else None,
            "until": until.isoformat() if until else None,
            "leases": [dict(l.to_dict(), gpu_hours=l.gpu_hours(since, until)) for l in leases],
            "usage": usage,
        })
    elif args.command == "queue":
        queue = pool.queue()
        rows = [[w.position, w.user, _server(w.server_name), w.count, _time(w.since), w.why] for w in queue]
        emit(_table(["POS", "USER", "SERVER", "GPUS", "SINCE", "WHY"], rows) if rows else "No requests waiting.",
             [w.to_dict() for w in queue])
    elif args.command == "fairshare":
        emit(fairshare_text(pool.fairshare()), pool.fairshare())
    elif args.command == "book":
        start, end = _parse_time(args.start, "start"), _parse_time(args.end, "end")
        if start is None or end is None:
            raise CLIError("--start and --end are required")
        b = pool.book(args.user or _operator(), args.count, start, end, group=args.group, host=args.host,
                      by=_operator())
        emit(f"Booked {len(b.gpu_uuids)} GPU(s) on {b.host} ({', '.join(b.gpu_uuids)}) for "
             f"{'group ' + b.group if b.group else b.user} from {_time(b.starts_at)} to {_time(b.ends_at)} "
             f"(booking {b.id}).", b.to_dict())
    elif args.command == "bookings":
        found = pool.bookings()
        rows = [[b.id, b.user, b.group or "", b.host, len(b.gpu_uuids), _time(b.starts_at), _time(b.ends_at)]
                for b in found]
        emit(_table(["ID", "USER", "GROUP", "HOST", "GPUS", "FROM", "TO"], rows) if rows else "No bookings.",
             [b.to_dict() for b in found])
    elif args.command == "unbook":
        b = pool.cancel_booking(args.booking_id, _operator(), admin=True)
        emit(f"Cancelled booking {b.id} of {b.user}.", b.to_dict())
    elif args.command in ("drain", "undrain"):
        status = getattr(pool, args.command)(args.uuid, host=args.host, by=_operator())
        if args.command == "drain":
            text = f"Drained GPU {status.gpu.uuid} on {status.gpu.host}: it will not be lent again until undrained."
            if status.lease:
                text += (f" Lease {status.lease.id} of {status.lease.user}/{_server(status.lease.server_name)}"
                         " keeps it until that server stops.")
        else:
            text = f"GPU {status.gpu.uuid} on {status.gpu.host} is lendable again."
        emit(text, status.to_dict())
    elif args.command == "rehome":
        moved = pool.rehome(args.old_host, args.new_host)
        emit(f"Moved {moved['gpus']} GPU(s) and {moved['leases']} active lease(s) from host "
             f"{args.old_host} to {args.new_host}.", moved)
    elif args.command == "release":
        lease = pool.lease(args.lease_id)
        if lease is None:
            raise CLIError(f"No lease {args.lease_id} in the ledger")
        ended = pool.release(args.lease_id, args.reason)
        lease = pool.lease(args.lease_id)
        if lease is None:  # only a cancelled acquire erases its lease, and this one was there above
            raise CLIError(f"Lease {args.lease_id} vanished from the ledger while it was released", 1)
        if ended:
            text = (f"Released lease {lease.id} of {lease.user}/{_server(lease.server_name)} "
                    f"({len(lease.gpu_uuids)} GPU(s)) as {args.reason}.")
        else:
            text = f"Lease {lease.id} had already ended ({lease.end_reason} at {_time(lease.ended_at)})."
        emit(text, dict(lease.to_dict(), released=ended))
    return 0


def _operator() -> str:
    """Who runs this command, for the ledger's audit records."""
    try:
        name = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        name = f"uid {os.geteuid()}"
    return f"{name} (gpu-pool command)"


def _exec(args, out) -> int:
    from . import exec_client as client

    try:
        script = sys.stdin.read() if args.script == "-" else Path(args.script).read_text()
    except OSError as e:
        raise CLIError(f"Cannot read the script: {e}") from None
    try:
        data = client.exec_script(args.hub_url, args.token, script, args.timeout,
                                  profile=args.profile, group=args.group, users=args.users,
                                  progress=lambda message: print(message, file=sys.stderr))
    except client.ExecFailed as e:
        raise CLIError(str(e), e.code) from None
    print(json.dumps(data, indent=2) if getattr(args, "json", False) else client.render(data), file=out)
    return client.exit_status(data)


def _doctor(args, out) -> int:
    from ..settings import SettingsError
    from . import doctor

    hub_user = args.hub_user or pwd.getpwuid(os.geteuid()).pw_name
    config_path = getattr(args, "config", None)
    if config_path:
        config, base_dir = load_config(config_path)
        if config.GPUPool.get("db_url", None):
            config.GPUPool.db_url = absolute_sqlite_url(config.GPUPool.db_url, base_dir)
        target = doctor.Target(config, doctor.data_dir_of(config, Path(base_dir or os.getcwd())), hub_user)
    else:
        try:
            target = doctor.target_from_env(hub_user, env_file_problems=args.env_file_problems)
        except SettingsError as e:
            raise CLIError(f"GPUHUB_* settings: {e}") from None
    url = getattr(args, "db_url", None) or ledger_env(ENV_DB_URL)
    if url:
        target.config.GPUPool.db_url = url
    results = doctor.Doctor(target).run()
    if getattr(args, "json", False):
        print(json.dumps(doctor.as_json(results), indent=2), file=out)
    else:
        print(doctor.render(results), file=out)
    return doctor.exit_status(results)


def _agent(args) -> int:
    import logging

    from ..inventory.kinds import inventory_from_config
    from .agent import Agent

    if not args.interval > 0:
        raise CLIError("--interval must be > 0 seconds")
    if args.inventory not in AGENT_INVENTORIES:  # a default from GPUHUB_AGENT_INVENTORY
        raise CLIError(f"GPUHUB_AGENT_INVENTORY={args.inventory!r} must be one of: {', '.join(AGENT_INVENTORIES)}")
    url = getattr(args, "db_url", None)
    if not url and args.db_url_file:
        try:
            url = Path(args.db_url_file).read_text().strip()
        except OSError as e:
            raise CLIError(f"Cannot read the ledger URL from {args.db_url_file}: {e.strerror}", code=1) from None
    config, _ = load_config(getattr(args, "config", None))
    if args.host:
        config.Inventory.host = args.host
    if args.simulated_gpus is not None:
        config.SimulatedInventory.count = args.simulated_gpus
    if args.utilization_file:
        config.SimulatedInventory.utilization_file = args.utilization_file
    try:
        inventory = inventory_from_config(args.inventory, config)
    except TraitError as e:
        raise CLIError(str(e)) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    pool = build_pool(url, getattr(args, "config", None))
    agent = Agent(pool, inventory, args.interval)
    agent.stop_on_signals()
    try:
        agent.run()
    finally:
        pool.close()
    return 0


def fairshare_text(data: dict) -> str:
    """`gpu-pool fairshare`'s tables (see GPUPool.fairshare)."""
    days = data["half_life_s"] / 86400
    head = (f"Queue order: {data['order']}; recent use = GPU-hours with a half-life of {days:g} days; requests "
            f"waiting over {data['fifo_after_s']:g} s go in arrival order.")
    users = [[u["user"], f"{u['recent_gpu_hours']:.2f}", f"{u['total_gpu_hours']:.2f}", f"{u['share']:g}",
              f"{u['standing']:.2f}", f"{u['priority']:.4f}"] for u in data["users"]]
    groups = [[g["group"], f"{g['recent_gpu_hours']:.2f}", "-" if g["share"] is None else f"{g['share']:g}",
               "-" if g["standing"] is None else f"{g['standing']:.2f}"] for g in data["groups"]]
    parts = [head,
             _table(["USER", "RECENT GPU-H", "TOTAL GPU-H", "SHARE", "STANDING", "PRIORITY"], users)
             if users else "No GPU use yet."]
    if groups:
        parts.append(_table(["GROUP", "RECENT GPU-H", "SHARE", "STANDING"], groups))
        parts.append("Groups without a share (GPUPool.fairshare_group_shares) do not count in the order.")
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    out, err = sys.stdout, sys.stderr
    try:
        parser = _parser()
        args = parser.parse_args(argv)
        if not args.command:
            parser.print_help(out)
            return 2
        args.env_file_problems = load_env_file(getattr(args, "env_file", None))
        if args.command == "doctor":
            return _doctor(args, out)
        if args.command == "exec":
            return _exec(args, out)
        if args.command == "agent":
            return _agent(args)
        pool = build_pool(getattr(args, "db_url", None), getattr(args, "config", None))
        try:
            return _run(args, pool, out)
        finally:
            pool.close()
    except CLIError as e:
        print(f"gpu-pool: {e}", file=err)
        return e.code
    except PoolUnavailable as e:
        print(f"gpu-pool: {e}", file=err)
        return 1
    except PoolError as e:
        print(f"gpu-pool: {e}", file=err)
        return 2
    except KeyboardInterrupt:
        return 130
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    except Exception as e:  # a bug: still one line, never a traceback with secrets in it
        print(f"gpu-pool: unexpected error: {type(e).__name__}: {e}", file=err)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
