"""Notifications outside the tab (issue 39): the events the ledger's outbox holds, told by mail, webhook, browser.

- settings.py: the e-mail channel's options (SMTP server, sender, limits); off by default.
- preferences.py: each user's choice per event and channel, its defaults and validation.
- directory.py: the user's address (the directory's `mail` attribute in auth_state) and choices,
  kept in the ledger (gpu_pool_notify_users).
- signing.py: the signed one-click unsubscribe links.
- message.py: an event (or a digest of several) as a mail, plain text and escaped HTML, with
  headers no user input can add to.
- smtp.py: one mail over SMTP (STARTTLS or TLS), telling whether the server may have taken it.
- booking_watch.py: the service's watch that tells bookings starting, ready, and the holders of
  booked GPUs; watch.py: the loop both watches run in.
- budget_watch.py: the service's watch that tells a GPU-hour budget at 80 % and 100 %.
- browser.py: the browser channel: the feed an open pool page asks for the user's new events.
- sender.py: the sender task of the gpu-pool service: claims due rows from the outbox, applies
  preferences and the per-user rate limit (a digest), sends on its own threads with timeouts.

The ledger writes the events (spawner/pool/ledger/events.py) in the transaction of their fact;
this package only reads them, so the pool never calls it.
"""

from .settings import EmailNotifications

__all__ = ["EmailNotifications"]
