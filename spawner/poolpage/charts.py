"""Charts for the pool page, drawn on the server as inline SVG: pure functions of their data.

No JavaScript and no charting library: the page works without scripts, every
label is escaped here, and a test can read the numbers back out of the SVG.
"""

from __future__ import annotations

from html import escape

WIDTH, HEIGHT = 720, 220
LEFT, RIGHT, TOP, BOTTOM = 44, 12, 14, 40
COLORS = {"lent": "#e69500", "drained": "#9e9e9e", "free": "#4caf50", "queue": "#1565c0", "bar": "#5c6bc0"}


def _num(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


def _nice_max(value: float) -> float:
    """The smallest of 4, 8, 20, 40, 80, 200... at or above `value`: an axis' top whose
    quarters (the grid lines) are whole numbers."""
    top = 4.0
    while top < value:
        for f in (2, 2.5, 2):
            top *= f
            if top >= value:
                break
    return top


def _label_time(iso: str, span_s: float) -> str:
    # '2026-01-02T03:04:00+00:00' -> '01-02 03:04' (or the time alone within a day)
    return iso[11:16] if span_s <= 86400 else iso[5:10] + " " + iso[11:16]


def area_chart(chart_id: str, title: str, times: list[str], layers: list[tuple[str, list[float]]],
               unit: str, step_s: float, y_max: float | None = None) -> str:
    """Stacked areas (first layer at the bottom) over equal time buckets, as an <svg>.

    `layers`: (name, one value per bucket); `y_max`: the axis' top (default:
    the highest stack, rounded up).  Each bucket is a step (its mean), not a
    line between points, so a bucket's value is read off as it is.
    """
    n = len(times)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    stacks = [sum(v[i] for _, v in layers) for i in range(n)] or [0]
    top = y_max if y_max else _nice_max(max(stacks) or 1)
    x = lambda i: LEFT + plot_w * i / max(n, 1)  # noqa: E731
    y = lambda v: TOP + plot_h * (1 - min(v, top) / top)  # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" id="{escape(chart_id)}" class="chart" role="img" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" style="max-width:{WIDTH}px">',
             f"<title>{escape(title)}</title>"]
    for k in range(5):  # horizontal grid and the y axis' numbers
        v = top * k / 4
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>'
                     f'<text x="{LEFT - 4}" y="{y(v) + 4:.1f}" font-size="11" text-anchor="end">{_num(v)}</text>')
    base = [0.0] * n
    for name, values in layers:
        color = COLORS.get(name, "#888")
        upper = [base[i] + values[i] for i in range(n)]
        points = []
        for i in range(n):  # the top edge, as steps
            points += [(x(i), y(upper[i])), (x(i + 1), y(upper[i]))]
        for i in reversed(range(n)):  # back along the bottom edge
            points += [(x(i + 1), y(base[i])), (x(i), y(base[i]))]
        if points:
            path = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
            parts.append(f'<polygon class="layer" data-layer="{escape(name)}" points="{path}" fill="{color}" '
                         f'fill-opacity="0.85"><title>{escape(name)}</title></polygon>')
        base = upper
    parts.append(f'<text x="{LEFT - 36}" y="{TOP - 3}" font-size="11">{escape(unit)}</text>')
    span = step_s * n
    for i in sorted({0, n // 2, n}) if n else []:  # start, middle, end of the period
        label = _label_time(times[i], span) if i < n else "now"
        anchor = "start" if i == 0 else "end" if i == n else "middle"
        parts.append(f'<text x="{x(i):.1f}" y="{HEIGHT - BOTTOM + 14}" font-size="11" '
                     f'text-anchor="{anchor}">{escape(label)}</text>')
    lx = LEFT
    for name, _ in layers:  # the legend
        parts.append(f'<rect x="{lx}" y="{HEIGHT - 16}" width="10" height="10" fill="{COLORS.get(name, "#888")}"/>'
                     f'<text x="{lx + 14}" y="{HEIGHT - 7}" font-size="11">{escape(name)}</text>')
        lx += 24 + 7 * len(name)
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(chart_id: str, title: str, items: list[tuple[str, float]], unit: str, max_bars: int = 15) -> str:
    """Horizontal bars, largest first (the rest summed as 'others'), each labelled with its value."""
    items = sorted(items, key=lambda kv: (-kv[1], kv[0]))
    if len(items) > max_bars:
        items = items[:max_bars - 1] + [("(others)", sum(v for _, v in items[max_bars - 1:]))]
    row, label_w = 22, 140
    height = TOP + row * max(len(items), 1) + 8
    top = max([v for _, v in items] + [0]) or 1
    plot_w = WIDTH - label_w - 90
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" id="{escape(chart_id)}" class="chart" role="img" '
             f'viewBox="0 0 {WIDTH} {height}" width="100%" style="max-width:{WIDTH}px">',
             f"<title>{escape(title)}</title>"]
    if not items:
        parts.append(f'<text x="{label_w}" y="{TOP + 12}" font-size="12">No GPU use in this period.</text>')
    for i, (name, value) in enumerate(items):
        y0 = TOP + i * row
        w = plot_w * value / top
        parts.append(f'<text x="{label_w - 6}" y="{y0 + 14}" font-size="12" text-anchor="end">{escape(name)}</text>'
                     f'<rect class="bar" data-name="{escape(name)}" data-value="{value:.3f}" x="{label_w}" '
                     f'y="{y0 + 3}" width="{w:.1f}" height="{row - 6}" fill="{COLORS["bar"]}"/>'
                     f'<text x="{label_w + w + 6:.1f}" y="{y0 + 14}" font-size="12">{value:.2f} {escape(unit)}</text>')
    parts.append("</svg>")
    return "".join(parts)
