#!/usr/bin/env python3
"""Notebook jobs: "Create" in JupyterLab's Jupyter Scheduler -> the job running, against `gpu-job submit`.

On a real hub and dockerd with the MKL image (which has Jupyter Scheduler and the hub's
backend), a small notebook in the user's home is started three ways, one after the other,
each timed from the request to Docker's own StartedAt of the job's container:

  scheduler    POST /user/NAME/scheduler/jobs (what the form's Create button sends), which the
               backend turns into POST api/jobs
  --notebook   `gpu-job submit --notebook` in the user's server (docker exec, as a terminal does)
  script       `gpu-job submit -- python small.py`, the same notebook as a script

    .venv/bin/python bench/bench_notebook_jobs.py [--rounds 5] [--image IMG]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_jobs import container_started, jobs_api, wait_job  # noqa: E402
from bench.common import environment, median  # noqa: E402
from devservices.hub import cleanup_hub, prepare_hub, wait_for  # noqa: E402

NOTEBOOK = {
    "cells": [{"id": "p", "cell_type": "code", "metadata": {"tags": ["parameters"]}, "execution_count": None,
               "outputs": [], "source": "epochs = 1\n"},
              {"id": "t", "cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
               "source": "print('trained for', epochs, 'epochs')\n"}],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    "nbformat": 4, "nbformat_minor": 5,
}
SCRIPT = "epochs = 1\nprint('trained for', epochs, 'epochs')\n"


def newest_job(hub, token, after: set[int]) -> int:
    return wait_for(lambda: [j["id"] for j in jobs_api(hub, "GET", "", token).json()["jobs"] if j["id"] not in after],
                    timeout=120, interval=0.05)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--image", default="gpuhub/notebook-mkl:latest", help="the MKL image (built by make images)")
    args = parser.parse_args()

    import requests

    client, _minimal, network = environment()
    with tempfile.TemporaryDirectory() as tmp:
        hub = prepare_hub(Path(tmp), args.image, network, env={"GPUHUB_GPU_IMAGE": args.image,
                                                               "GPUHUB_CPU_IMAGE": args.image})
        try:
            hub.start()
            hub.create_user("bench")
            token = hub.user_token("bench")
            wait_for(lambda: jobs_api(hub, "GET", "", token).status_code == 200, timeout=60, what="the service")
            hub.start_server("bench", {"profile": "tf-cpu"}, timeout=180)
            box = [c for c in hub.containers(client) if c.name == f"{hub.prefix}-bench"][0]
            text = json.dumps(NOTEBOOK).replace("'", "'\"'\"'")
            code, out = box.exec_run(
                ["sh", "-c", f"printf '%s' '{text}' > small.ipynb && printf '%s' \"$0\" > small.py", SCRIPT],
                workdir="/home/jovyan")
            assert code == 0, out

            def scheduler() -> tuple[float, int]:
                seen = {j["id"] for j in jobs_api(hub, "GET", "", token).json()["jobs"]}
                began = time.time()
                r = requests.post(f"{hub.url}/user/bench/scheduler/jobs", timeout=60,
                                  headers={"Authorization": f"token {token}"},
                                  json={"input_uri": "small.ipynb", "runtime_environment_name": "tf-gpu-1",
                                        "name": "small", "output_formats": ["ipynb", "html"]})
                assert r.status_code == 200, r.text
                return began, newest_job(hub, token, seen)

            def gpu_job(*command: str):
                def run() -> tuple[float, int]:
                    began = time.time()
                    code, out = box.exec_run(["gpu-job", "submit", "--json", "--profile", "tf-gpu-1", *command],
                                             workdir="/home/jovyan")
                    assert code == 0, out
                    return began, json.loads(out)["id"]
                return run

            ways = {"scheduler (POST scheduler/jobs, as Create)": scheduler,
                    "gpu-job submit --notebook small.ipynb": gpu_job("--notebook", "small.ipynb"),
                    "gpu-job submit -- python small.py": gpu_job("--", "python", "small.py")}
            times: dict[str, list[float]] = {name: [] for name in ways}
            for round_ in range(args.rounds + 1):  # the first round warms up (images, the home volume)
                for name, way in ways.items():
                    began, job_id = way()
                    seconds = container_started(hub, client, job_id) - began
                    done = wait_job(hub, token, job_id, ("succeeded", "failed"))
                    assert done["state"] == "succeeded", done
                    if round_:
                        times[name].append(seconds)
            print(f"\nRequest -> job container running, {args.rounds} rounds (after one warm-up), image {args.image}")
            print("| how | median s | min s | max s |")
            print("|---|---|---|---|")
            for name, values in times.items():
                print(f"| {name} | {median(values):.3f} | {min(values):.3f} | {max(values):.3f} |")
        finally:
            cleanup_hub(hub, client)


if __name__ == "__main__":
    main()
