"""The hub keeps the oldest Docker bridge of its name: Docker's creation times, ordered as times."""

from spawner.settings.apply import _created


def test_creation_times_with_trimmed_fractions_sort_as_times():
    # Go's RFC 3339 trims trailing zeros: as text ".1Z" sorts after ".12Z", though it is earlier.
    times = ["2026-12-06T02:20:01.12Z", "2026-12-06T02:20:01.1Z", "2026-12-06T02:20:01Z",
             "2026-12-06T02:20:01.123456789Z", "2026-12-06T02:20:00.9Z"]
    assert sorted(times, key=_created) == ["2026-12-06T02:20:00.9Z", "2026-12-06T02:20:01Z",
                                           "2026-12-06T02:20:01.1Z", "2026-12-06T02:20:01.12Z",
                                           "2026-12-06T02:20:01.123456789Z"]
