"""The replay bench's plots (bench/replay.py --plots DIR): PNGs made with matplotlib's Agg backend.

matplotlib is the benches' optional extra (`pip install -e ".[bench]"`, which `make bench-replay`
installs), not a dependency of the product.

- `<name>-gpus.png`: GPUs lent and GPUs busy over the week, one panel per policy (10-minute
  averages), the capacity drawn across; the gap between the two is lent-but-idle.
- `<name>-waits.png`: the distribution of waits (the share of requests that waited at most x
  minutes) for interactive starts and for jobs, one line per policy.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    return plt


def _cdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    """Points of the empirical distribution: (minutes, share of requests that waited at most that)."""
    xs = sorted(v / 60 for v in values)
    return xs, [(i + 1) / len(xs) for i in range(len(xs))]


def _save(plt, fig, title: str, path: str) -> str:
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot(rows: Sequence, capacity: int, horizon: float, step: float, directory: str, name: str,
         title: str = "") -> list[str]:
    """Write `<name>-gpus.png` and `<name>-waits.png` into `directory` for the replays' `rows`
    (replay.Metrics, one per policy); the paths written."""
    plt = _pyplot()
    os.makedirs(directory, exist_ok=True)
    paths = []

    fig, axes = plt.subplots(len(rows), 1, figsize=(10, 1.9 * len(rows) + 0.8), sharex=True, squeeze=False)
    for ax, m in zip(axes[:, 0], rows):
        hours = [i * step / 3600 for i in range(len(m.lent_series))]
        ax.fill_between(hours, m.lent_series, step="post", color="#f4a582", label="lent")
        ax.fill_between(hours, m.busy_series, step="post", color="#2166ac", label="busy")
        ax.axhline(capacity, color="black", linewidth=0.8, linestyle="--", label="capacity")
        ax.set_ylim(0, capacity * 1.08)
        ax.set_ylabel("GPUs")
        ax.set_title(f"{m.policy}: lent {m.lent_share:.0%} of capacity, busy {m.busy_share:.0%} of lent",
                     fontsize=9, loc="left")
    axes[0, 0].legend(loc="upper right", fontsize=8, ncol=3)
    last = axes[-1, 0]
    last.set_xticks([24 * d for d in range(round(horizon / 86400) + 1)])
    last.set_xticklabels([DAYS[d % 7] if d < horizon / 86400 else "" for d in range(round(horizon / 86400) + 1)])
    last.set_xlim(0, horizon / 3600)
    paths.append(_save(plt, fig, title and f"{title}: GPUs lent and busy", os.path.join(directory, f"{name}-gpus.png")))

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), squeeze=False)
    for ax, what, label in ((axes[0, 0], "interactive_waits", "interactive starts"), (axes[0, 1], "job_waits", "jobs")):
        for m in rows:
            xs, ys = _cdf(getattr(m, what))
            if xs:
                ax.step(xs, ys, where="post", label=m.policy)
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlabel("wait (minutes)")
        ax.set_ylabel("share of requests")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"waits of {label}", fontsize=9, loc="left")
        ax.grid(True, linewidth=0.3)
    axes[0, 1].legend(loc="lower right", fontsize=8)
    paths.append(_save(plt, fig, title and f"{title}: waits", os.path.join(directory, f"{name}-waits.png")))
    return paths
