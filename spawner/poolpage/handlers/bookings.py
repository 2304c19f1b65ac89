"""Bookings through the pool service: api/bookings (GET, POST), api/bookings/ID (DELETE), the page's form.

A user books for themself; a pool admin (custom:gpu-pool:admin) for anyone or
for a group (a course, a deadline).  Every limit is the ledger's
(pool/fair_use/bookings.py: the longest window, how far ahead, GPU-hours a week,
bookings per user, overlaps with the next free window named); a body that is
not a small JSON object of the known keys is refused with 400 and changes
nothing.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from jupyterhub.utils import url_path_join
from tornado import web

from ...pool.models import PoolError
from ...services.hub_api import HubUnavailable
from .. import views
from .base import APIHandler, BaseHandler, path_id

MAX_BODY = 4096
KEYS = {"count", "starts_at", "ends_at", "host", "group", "user"}
TIMELINE_DAYS = 7


def booking_rows(bookings, viewer: views.Viewer) -> list[dict]:
    """Bookings as the API and the page show them: the booker's name only to whom may see it."""
    return [dict(b.to_dict(show_user=viewer.may_see(b.user)), yours=b.user == viewer.name) for b in bookings]


def parse(body: bytes) -> dict:
    """The booking asked for, checked for shape (the ledger checks the rest); BadInput otherwise."""
    if len(body) > MAX_BODY:
        raise views.BadInput(f"The request body is larger than {MAX_BODY} bytes")
    try:
        data = json.loads(body or b"null")
    except ValueError:
        raise views.BadInput("The body must be JSON, like {\"count\": 1, \"starts_at\": \"2026-12-02T14:00Z\", "
                             "\"ends_at\": \"2026-12-02T16:00Z\"}") from None
    if not isinstance(data, dict):
        raise views.BadInput("The body must be a JSON object")
    unknown = sorted(str(k) for k in set(data) - KEYS)
    if unknown:
        raise views.BadInput(f"Unknown keys {unknown}; a booking takes {sorted(KEYS)}")
    count = data.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int):
        raise views.BadInput("count must be a whole number of GPUs")
    out: dict = {"count": count}
    for key in ("starts_at", "ends_at"):
        raw = data.get(key)
        if not isinstance(raw, str):
            raise views.BadInput(f"{key} must be an ISO 8601 time, like 2026-12-02T14:00Z")
        out[key] = views.parse_time(raw, key)
        if out[key] is None:
            raise views.BadInput(f"{key} is required")
    for key in ("host", "group", "user"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise views.BadInput(f"{key} must be a string")
        out[key] = data.get(key) or None
    return out


class BookingsAPI(APIHandler):
    async def get(self):
        viewer = self.require_viewer()
        found = await self.call(self.pool.bookings)
        limits = self.pool.booking_limits()
        self.write_json({"bookings": booking_rows(found, viewer),
                         "limits": {"max_hours": limits.max_hours, "max_days_ahead": limits.max_days_ahead,
                                    "max_gpu_hours_per_week": limits.max_gpu_hours_per_week,
                                    "max_per_user": limits.max_per_user, "grace_s": limits.grace_s,
                                    "notice_s": limits.notice_s}})

    async def post(self):
        viewer = self.require_viewer()
        try:
            asked = parse(self.request.body)
        except views.BadInput as exc:
            raise web.HTTPError(400, str(exc)) from None
        booking = await book(self, viewer, asked)
        self.set_header("Location", url_path_join(self.request.path, str(booking.id)))
        self.write_json(booking_rows([booking], viewer)[0], status=201)


async def viewer_groups(handler: BaseHandler, viewer: views.Viewer) -> tuple[str, ...]:
    """The viewer's hub groups: from their identity when it has them, else from the hub."""
    from .actions import hub_api

    user = handler.current_user if isinstance(handler.current_user, dict) else {}
    if "groups" in user:
        return tuple(user.get("groups") or ())
    try:
        return await hub_api(handler).groups_of(viewer.name)
    except HubUnavailable:
        raise web.HTTPError(503, "The hub did not say which groups you are in; try again in a moment") from None


def profile_most(handler: BaseHandler, groups: tuple[str, ...]) -> tuple[int, list[str]] | None:
    """(the most GPUs one server or job of the user's profiles takes, those profiles' names), or
    None when the service does not know the profiles."""
    profiles = handler.settings.get("lab_profiles") or []
    if not profiles:
        return None
    mine = [p for p in profiles if p.allows(groups)]
    return max((p.gpus for p in mine), default=0), [p.slug for p in mine]


async def book(handler: APIHandler, viewer: views.Viewer, asked: dict):
    """Book as `viewer` may: for themself, at most what their quota and profiles allow and with
    notice to the people using the GPUs now; or (a pool admin) for anyone or a group, from now."""
    user = asked.get("user") or viewer.name
    if (user != viewer.name or asked.get("group")) and not viewer.admin:
        raise web.HTTPError(403, "Only a GPU pool admin books for another user or for a group")
    groups: tuple[str, ...] = ()
    if not viewer.admin:
        groups = await viewer_groups(handler, viewer)
        most = profile_most(handler, groups)
        if most is not None and asked["count"] > most[0]:
            raise web.HTTPError(400, f"Your profiles ({', '.join(most[1]) or 'none'}) take at most "
                                     f"{most[0]} GPU(s) each, so you may book at most that many")
    try:
        return await handler.call(handler.pool.book, user, asked["count"], asked["starts_at"], asked["ends_at"],
                                  group=asked.get("group"), host=asked.get("host"), by=viewer.name,
                                  admin=viewer.admin, groups=groups)
    except PoolError as exc:  # BookingRefused (400), NotYours (403): the reason as it is
        raise web.HTTPError(exc.status_code, str(exc)) from None


class BookingAPI(APIHandler):
    async def delete(self, booking_id: str):
        viewer = self.require_viewer()
        try:
            done = await self.call(self.pool.cancel_booking, path_id(booking_id, f"No live booking {booking_id[:40]}"),
                                   viewer.name, viewer.admin)
        except PoolError as exc:
            raise web.HTTPError(exc.status_code, str(exc)) from None
        self.write_json(booking_rows([done], viewer)[0])


class BookingForm(BaseHandler):
    """The page's form: POST prefix/book (form fields as the API's keys), then back to the page."""

    @web.authenticated
    async def post(self):
        viewer = self.viewer()  # (HubOAuth checks the form's XSRF token on this cookie-authenticated POST)
        assert viewer is not None  # @web.authenticated: a current user
        fields = {k: self.get_body_argument(k, "").strip() for k in ("count", "starts_at", "ends_at", "group")}
        try:
            count = int(fields["count"] or "1")
        except ValueError:
            count = -1
        body = json.dumps({"count": count, "starts_at": fields["starts_at"], "ends_at": fields["ends_at"],
                           **({"group": fields["group"]} if fields["group"] else {})}).encode()
        try:
            asked = parse(body)
            booking = await book(self, viewer, asked)
            message = (f"Booked {len(booking.gpu_uuids)} GPU(s) on {booking.host} from "
                       f"{views.when(booking.starts_at)} to {views.when(booking.ends_at)} (booking {booking.id}).")
        except views.BadInput as exc:
            message = str(exc)
        except web.HTTPError as exc:
            message = exc.log_message or "The booking was refused"
        signed = self.create_signed_value("done", message).decode()
        self.redirect(f"{self.settings['prefix']}?done={signed}#bookings")

    async def call(self, fn, *args, **kwargs):
        return await APIHandler.call(self, fn, *args, **kwargs)


def timeline(bookings, gpus: list[dict], viewer: views.Viewer, now: datetime) -> list[dict]:
    """Per GPU, its bookings in the next TIMELINE_DAYS days (the page's per-GPU timeline)."""
    until = now + timedelta(days=TIMELINE_DAYS)
    rows = []
    for g in gpus:
        mine = [b for b in bookings if b.host == g["host"] and g["uuid"] in b.gpu_uuids and b.starts_at < until]
        rows.append({"host": g["host"], "index": g["index"], "uuid": g["uuid"],
                     "bookings": [{"from": views.when(b.starts_at), "to": views.when(b.ends_at),
                                   "who": ("you" if b.user == viewer.name else
                                           (f"group {b.group}" if b.group else
                                            (b.user if viewer.may_see(b.user) else views.HIDDEN))),
                                   "active": b.active(now)} for b in mine]})
    return rows


async def notices(handler: BaseHandler, viewer: views.Viewer, found=None) -> dict[str, str]:
    """{server name: the warning} for the viewer's servers on GPUs someone else has booked later."""
    from ...pool.fair_use import bookings as ledger_bookings

    found = found if found is not None else await handler.ledger(handler.pool.bookings)
    if not found:
        return {}
    user = handler.current_user if isinstance(handler.current_user, dict) else {}
    groups = tuple(user.get("groups") or ())
    now = datetime.now(UTC)
    out = {}
    for lease in await handler.ledger(handler.pool.leases, viewer.name):
        later = ledger_bookings.soon(lease.host, lease.gpu_uuids, found, viewer.name, groups, now)
        if later is not None:
            out[lease.server_name] = ledger_bookings.notice(later, now)
    return out


async def page_context(handler: BaseHandler, viewer: views.Viewer, gpus: list[dict]) -> dict:
    try:
        found = await handler.ledger(handler.pool.bookings)
        warned = await notices(handler, viewer, found)
    except PoolError:
        return {"bookings": [], "booking_timeline": [], "booking_limits": handler.pool.booking_limits(),
                "booking_notices": {}}
    return {"bookings": booking_rows(found, viewer), "booking_timeline": timeline(found, gpus, viewer,
                                                                                 datetime.now(UTC)),
            "booking_limits": handler.pool.booking_limits(), "booking_notices": warned}


def routes(prefix: str) -> list:
    api = url_path_join(prefix, "api", "bookings")
    return [(api, BookingsAPI), (api + r"/(\d+)", BookingAPI), (url_path_join(prefix, "book"), BookingForm)]
