"""What everyone sees live on the pool page, against a real hub, ledger and Docker: the
estimated wait of a queued spawn, each GPU's utilization and memory in use, when an idle server
is culled."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

from sqlalchemy import insert

from ..fixtures.hub import wait_for
from .test_poolpage import page_api, wait_for_page


def add_past_lease(hub, hours: float) -> None:
    """One ended lease of `hours` in the ledger's history (the accounting record)."""
    from spawner.pool.ledger.schema import leases_table

    ledger = hub.ledger()
    end = datetime.now(UTC) - timedelta(days=1)
    with ledger._engine_ready().begin() as conn:
        conn.execute(insert(leases_table).values(user_name="old", server_name="", host="h", groups="[]",
                                                 started_at=end - timedelta(hours=hours), ended_at=end,
                                                 end_reason="stopped"))


def test_queue_estimates_utilization_and_cull_deadlines(make_hub, tmp_path):
    utilization = tmp_path / "utilization.json"
    utilization.write_text("{}")
    hub = make_hub(env={"GPUHUB_CULL": "true", "GPUHUB_CULL_TIMEOUT_GPU": "3600",
                        "GPUHUB_SIMULATED_UTILIZATION_FILE": str(utilization),
                        "GPUHUB_GPU_IDLE_PERCENT": "0", "GPUHUB_LEASE_WAIT_TIMEOUT": "120"})
    for name in ("pat", "bob", "cy"):
        hub.create_user(name)
    pat, cy = hub.user_token("pat"), hub.user_token("cy")
    wait_for_page(hub, pat)
    add_past_lease(hub, hours=2)
    hub.start_server("pat", {"profile": "tf-gpu-2"})
    hub.start_server("bob", {"profile": "tf-gpu-2"})
    gpus = page_api(hub, "GET", "api/gpus", pat).json()["gpus"]
    # The first GPU with its memory in use (the simulated file's object form), the others a percent.
    utilization.write_text(json.dumps({g["uuid"]: {"utilization": 37, "memory_used_mib": 1229} if i == 0 else 37 + i
                                       for i, g in enumerate(gpus)}))

    # cy's spawn waits for a GPU: every GPU comes back after a typical (2 h) lease
    r = hub.api("POST", "/users/cy/server", json={"profile": "tf-gpu-1"})
    assert r.status_code == 202, r.text
    wait_for(lambda: page_api(hub, "GET", "api/queue", cy).json()["queue"], what="cy in the queue", hub=hub)
    wait = page_api(hub, "GET", "api/wait", cy).json()
    [row] = wait["queue"]
    assert row["yours"] and row["estimate"].endswith("(estimate)") and 7000 < row["estimate_s"] <= 7200
    assert "estimate" in wait["note"].lower()
    assert sorted(wait["utilization"].values()) == [37, 38, 39, 40]
    assert wait["memory_used_mib"] == {g["uuid"]: 1229 if i == 0 else None for i, g in enumerate(gpus)}
    rows = page_api(hub, "GET", "api/gpus", cy).json()["gpus"]
    assert [(g["utilization"], g["memory_used_mib"]) for g in rows] == [(37, 1229), (38, None), (39, None), (40, None)]
    page = page_api(hub, "GET", "", cy).text
    assert "about 2.0 h (estimate)" in page and 'id="estimate-note"' in page
    assert "37 %" in page
    assert "1.2 / 16.0 GiB" in page and page.count("/ 16.0 GiB") == 1  # unknown memory: the total only
    # Never another user's name (as a word: the job form's `--model_path` is no leak).
    named = [m.group(0) for m in re.finditer(r".{40}\b(bob|pat)\b.{40}", page, re.S)]
    assert not named, named

    # While cy waits, pat's idle GPU server is culled at the contended idle limit (5 min)...
    page = page_api(hub, "GET", "", pat).text
    assert re.search(r"If it stays idle, it is culled at \d\d:\d\d UTC \(in [45] min\) \(the idle limit "
                     r"while requests wait for GPUs, 5 min\)", page), page[-3000:]
    assert re.search(r'"pat": "\d{4}-', json.dumps(page_api(hub, "GET", "api/wait", pat).json()["cull_at"]))
    # ...and once nobody waits, an hour after its last activity.
    hub.api("DELETE", "/users/cy/server")
    wait_for(lambda: re.search(r"If it stays idle, it is culled at \d\d:\d\d UTC \(in (59|60) min\)",
                               page_api(hub, "GET", "", pat).text),
             what="pat's cull deadline back at the idle timeout", hub=hub)
