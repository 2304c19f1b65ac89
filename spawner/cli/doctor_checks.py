"""The doctor's results and its pure checks: each turns one fact into ok / warn / FAIL, a line
of detail and a fix, with no Docker, NVML or ledger call (cli/doctor.py gathers the facts).
"""

from __future__ import annotations

import pwd
import stat
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..engines.common.labels import LABEL_CUDA
from ..inventory.machine import image_cuda_version

OK, WARN, FAIL = "ok", "warn", "FAIL"


@dataclass
class Result:
    check: str
    status: str
    detail: str
    fix: str = ""



def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def version_at_least(version: str, wanted: tuple[int, ...]) -> bool:
    """'28.2.1' >= (28, 2); a version that does not parse counts as older."""
    parts = []
    for piece in version.split("+")[0].split("-")[0].split(".")[: len(wanted)]:
        if not piece.isdigit():
            return False
        parts.append(int(piece))
    return tuple(parts) >= wanted


def cuda_fit(image: str, labels: dict, gpus: int, driver: tuple[int, int] | None) -> Result:
    """Does the image's CUDA label fit the driver's CUDA version?"""
    needed = image_cuda_version((labels or {}).get(LABEL_CUDA))
    name = f"image {image}"
    if needed is None:
        if gpus and not (labels or {}).get(LABEL_CUDA):
            return Result(name, WARN, f"present, no {LABEL_CUDA} label: its CUDA cannot be checked")
        return Result(name, OK, "present (CPU image)" if not gpus else "present, no CUDA needed")
    want = f"{needed[0]}.{needed[1]}"
    if driver is None:
        return Result(name, WARN, f"present, needs CUDA {want}; the driver's CUDA version is unknown")
    have = f"{driver[0]}.{driver[1]}"
    if needed > driver:
        return Result(name, FAIL, f"needs CUDA {want} but this host's driver supports up to {have}",
                      f"update the NVIDIA driver to one supporting CUDA {want}, or build the image "
                      f"for CUDA {have} or older")
    return Result(name, OK, f"present, needs CUDA {want}; the driver supports up to {have}")


def image_variant(image: str) -> str | None:
    """The images/build.py variant that makes `image` (gpuhub/notebook-cuda:latest: cuda), or None."""
    repo, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "latest")
    if tag == "latest" and repo.startswith("gpuhub/notebook-"):
        return repo.removeprefix("gpuhub/notebook-") or None
    return None


def source_clone() -> Path | None:
    """The clone this package was installed from (install.sh notes it beside the hub's config,
    PREFIX/hub_config/clone), or this package's own checkout; None when unknown."""
    noted = Path(sys.prefix).parent / "hub_config" / "clone"
    candidates = [Path(noted.read_text().strip())] if noted.is_file() else []
    candidates.append(Path(__file__).resolve().parents[2])
    return next((c for c in candidates if (c / "images" / "build-images.sh").is_file()), None)


def build_command(variant: str) -> str:
    """The exact command that builds a notebook image variant on this host."""
    clone = source_clone()
    script = f"{clone}/images/build-images.sh" if clone else "images/build-images.sh"
    where = "" if clone else " (in the clone this was installed from)"
    return f"PYTHON={sys.executable} {script} {variant}{where}"


def visible_devices(environ: bytes) -> str:
    """NVIDIA_VISIBLE_DEVICES in a /proc/PID/environ dump ('' when unset)."""
    env = dict(item.split("=", 1) for item in environ.decode(errors="replace").split("\0") if "=" in item)
    return env.get("NVIDIA_VISIBLE_DEVICES", "")


def data_dir_result(path: Path, hub_user: str) -> Result:
    name = "data directory"
    if not path.is_dir():
        return Result(name, FAIL, f"{path} does not exist",
                      f"mkdir -p {path} && chown {hub_user} {path} && chmod 700 {path}")
    st = path.stat()
    try:
        uid = pwd.getpwnam(hub_user).pw_uid
    except KeyError:
        return Result(name, FAIL, f"no user {hub_user!r} on this machine", "pass --hub-user with the hub's user")
    if st.st_uid != uid:
        try:
            owner = pwd.getpwuid(st.st_uid).pw_name
        except KeyError:
            owner = str(st.st_uid)
        return Result(name, FAIL, f"{path} is owned by {owner}, not by the hub's user {hub_user}",
                      f"chown -R {hub_user} {path}")
    if st.st_mode & stat.S_IWOTH:
        return Result(name, FAIL, f"{path} is world-writable (mode {stat.S_IMODE(st.st_mode):o}): anyone "
                      "could replace the hub's database or cookie secret", f"chmod o-w {path} (700 is best)")
    return Result(name, OK, f"{path}, owned by {hub_user}, mode {stat.S_IMODE(st.st_mode):o}")


def host_rules_result(network: str, missing: list[str] | None, icc_off: bool, why_unreadable: str | None = None,
                      ports: Sequence[int] = ()) -> Result:
    """The host's rules that keep users' containers apart (engines/common/firewall.py): `missing` as
    `iptables -A` lines (None: the bridge does not exist yet), `icc_off` its enable_icc=false."""
    name = "host rules"
    if why_unreadable:
        return Result(name, WARN, f"cannot read this host's iptables rules: {why_unreadable}",
                      "run gpu-pool doctor as root (the hub installs the rules as root at its start)")
    if missing is None:
        return Result(name, WARN, f"the bridge {network} does not exist yet: the hub makes it, with "
                      "enable_icc=false, and installs its rules at its start")
    if missing:
        shown = "; ".join(missing[:4]) + (f" (and {len(missing) - 4} more)" if len(missing) > 4 else "")
        return Result(name, FAIL, f"{len(missing)} rule(s) keeping users' containers apart are missing: {shown}",
                      "restart the hub as root (it installs them; a firewall service may have flushed them), "
                      "or add them with iptables as shown")
    ports_text = ", ".join(map(str, ports))
    if not icc_off:
        return Result(name, WARN, f"in place (containers on {network} reach ports {ports_text} of the host only), "
                      "but the bridge was made without enable_icc=false: its containers are kept apart by "
                      "the hub's own rule only (needs br_netfilter)",
                      f"stop every server, `docker network rm {network}`, restart the hub (it makes it again)")
    return Result(name, OK, f"containers on {network} reach ports {ports_text} of the host only, not each "
                  "other, nor 169.254.0.0/16; job clusters' internal networks reach nothing on the host")


def overlay_result(network: str, attrs: dict | None) -> Result:
    """Swarm: the servers' overlay `network` (docker network inspect; None: not there) encrypted?"""
    name = "overlay"
    if attrs is None:
        return Result(name, FAIL, f"there is no network {network} (GPUHUB_DOCKER_NETWORK)",
                      f"docker network create --driver overlay --attachable --opt encrypted {network}")
    if "encrypted" not in (attrs.get("Options") or {}):
        return Result(name, WARN, f"{network} is not encrypted: the servers' traffic with the hub (tokens, "
                      "notebooks) crosses the nodes' network readable; users' servers on it reach each other "
                      "(an overlay has no enable_icc)",
                      f"with no server running: docker network rm {network}; docker network create --driver "
                      f"overlay --attachable --opt encrypted {network} (needs ESP, IP protocol 50, between nodes)")
    return Result(name, OK, f"{network} is encrypted (IPsec between nodes); users' servers on it still reach "
                  "each other (an overlay has no enable_icc)")


def render(results: list[Result]) -> str:
    width = max((len(r.check) for r in results), default=0)
    lines = []
    for r in results:
        lines.append(f"{r.status:<4}  {r.check:<{width}}  {r.detail}")
        if r.fix and r.status != OK:
            lines.append(f"{'':<4}  {'':<{width}}  fix: {r.fix}")
    failed = sum(r.status == FAIL for r in results)
    lines.append(f"{failed} check(s) failed" if failed else "all checks passed")
    return "\n".join(lines)


def as_json(results: list[Result]) -> list[dict[str, Any]]:
    return [asdict(r) for r in results]


def exit_status(results: list[Result]) -> int:
    return 1 if any(r.status == FAIL for r in results) else 0
