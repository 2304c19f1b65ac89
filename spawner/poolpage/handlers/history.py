"""Usage over time on the pool page and in its API: occupancy, queue length, GPU-hours.

GET api/occupancy(.csv) gives the bucketed series for a period; the page
draws them (charts.py) beside GPU-hours per user and per group.  Occupancy
and queue length are anonymous, so every user sees them; GPU-hours per user
and group follow views.usage_for (everyone's for admins, else one's own).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from jupyterhub.utils import url_path_join
from tornado import web

from .. import charts, occupancy, views
from .base import APIHandler, BaseHandler


def chosen_period(handler: BaseHandler, now: datetime) -> tuple[datetime, datetime, str]:
    """(since, until, name) from ?period=24h|7d|30d, or ?since=&until= (until: now)."""
    raw = handler.get_argument("period", "").strip()
    since_raw, until_raw = handler.get_argument("since", None), handler.get_argument("until", None)
    if raw and (since_raw or until_raw):
        raise views.BadInput("Give either period or since/until, not both")
    if since_raw or until_raw:
        since, until = views.usage_period(since_raw, until_raw)
        until = min(until or now, now)
        since = since or until - occupancy.PERIODS[occupancy.DEFAULT_PERIOD]
        if since >= until:
            raise views.BadInput("since must be before until (and before now)")
        most = handler.settings["limits"].occupancy_max_days
        if until - since > timedelta(days=most):
            raise views.BadInput(f"api/occupancy covers at most {most} days from since to until "
                                 "(PoolServiceLimits.occupancy_max_days); ask for a shorter period")
        return since, until, "custom"
    raw = raw or occupancy.DEFAULT_PERIOD
    if raw not in occupancy.PERIODS:
        raise views.BadInput(f"period={raw!r}: use one of {', '.join(occupancy.PERIODS)}")
    return now - occupancy.PERIODS[raw], now, raw


async def period_data(handler: BaseHandler, viewer: views.Viewer, buckets: int) -> dict:
    """The series and the GPU-hours of the chosen period (raises views.BadInput)."""
    since, until, name = chosen_period(handler, datetime.now(UTC))
    call = handler.call if isinstance(handler, APIHandler) else handler.ledger  # API: pool errors as 4xx/503
    # Steps of an hour or more: the lent GPUs from the hourly rollup (exact per hour, spread evenly
    # within it), so a busy week costs what its hours cost, not its thousands of leases.
    hourly = (until - since) / buckets >= occupancy.HOURLY_FROM
    timeline = await call(handler.pool.timeline, since, until, hourly)
    usage = views.usage_for(await call(handler.pool.usage, since, until), viewer)
    return {"period": name, "since": since.isoformat(), "until": until.isoformat(),
            # Off the event loop: bucketing a long history is seconds of CPU.
            "series": await asyncio.to_thread(occupancy.series, timeline, buckets), "usage": usage}


def chart_svgs(data: dict) -> dict[str, str]:
    """The page's charts of one period's data."""
    s = data["series"]
    return {
        "occupancy": charts.area_chart(
            "chart-occupancy", f"GPUs lent, drained and free, {data['since'][:16]} to {data['until'][:16]} UTC",
            s["times"], [("lent", s["lent"]), ("drained", s["drained"]), ("free", s["free"])], "GPUs",
            s["step_s"], y_max=max(s["gpus"], 1)),
        "queue": charts.area_chart(
            "chart-queue", "Requests waiting in the queue", s["times"], [("queue", s["queue"])], "waiting",
            s["step_s"]),
        "users": charts.bar_chart("chart-users", "GPU-hours per user", list(data["usage"]["users"].items()), "h"),
        "groups": charts.bar_chart("chart-groups", "GPU-hours per group", list(data["usage"]["groups"].items()), "h"),
    }


async def page_context(handler: BaseHandler, viewer: views.Viewer) -> dict:
    """What the page's usage section needs; a bad period shows as a message, not an error page."""
    try:
        data = await period_data(handler, viewer, occupancy.DEFAULT_BUCKETS)
    except views.BadInput as exc:
        handler.set_status(400)
        return {"period_error": str(exc), "periods": list(occupancy.PERIODS), "period": None, "charts": {}}
    return {"period": data["period"], "periods": list(occupancy.PERIODS), "period_since": data["since"],
            "period_until": data["until"], "period_usage": data["usage"], "charts": chart_svgs(data),
            "period_error": None}


class OccupancyAPI(APIHandler):
    async def data(self) -> dict:
        viewer = self.require_viewer()
        try:
            buckets = int(self.get_argument("buckets", str(occupancy.DEFAULT_BUCKETS)))
            if not 1 <= buckets <= occupancy.MAX_BUCKETS:
                raise ValueError
            return await period_data(self, viewer, buckets)
        except ValueError as exc:  # views.BadInput too
            message = str(exc) if isinstance(exc, views.BadInput) else \
                f"buckets must be a whole number from 1 to {occupancy.MAX_BUCKETS}"
            raise web.HTTPError(400, message) from None

    async def get(self):
        self.write_json(await self.data())


class OccupancyCSV(OccupancyAPI):
    async def get(self):
        data = await self.data()
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header("Content-Disposition", 'attachment; filename="gpu-occupancy.csv"')
        self.finish(occupancy.series_csv(data["series"]))


def routes(prefix: str) -> list:
    api = url_path_join(prefix, "api")
    return [(url_path_join(api, "occupancy"), OccupancyAPI), (url_path_join(api, "occupancy.csv"), OccupancyCSV)]
