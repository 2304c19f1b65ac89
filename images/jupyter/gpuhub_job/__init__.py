"""gpu-job: run a command on leased GPUs as a batch job, from a notebook server's terminal.

    gpu-job submit --profile tf-gpu-1 -- python train.py --epochs 5 --model_path model.keras
    gpu-job logs -f 12        # follow job 12's output until it ends
    gpu-job status 12         # state, exit code, GPUs, times
    gpu-job cancel 12
    gpu-job list

The job runs in your home (the current directory, when it is inside your home), with
the profile's image and limits, and holds its GPUs only while it runs.  It talks to
the hub's gpu-pool service with this server's own token ($JUPYTERHUB_API_TOKEN) at
$GPUHUB_JOBS_URL, both set by the hub.
"""

import argparse
import json
import os
import sys
import urllib.error
import urllib.request

TERMINAL = ("succeeded", "failed", "cancelled", "timed-out")


def fail(message, code=1):
    print(f"gpu-job: {message}", file=sys.stderr)
    sys.exit(code)


def request(args, method, path, body=None, stream=False):
    url = args.url.rstrip("/") + "/api/jobs" + path
    token = os.environ.get("JUPYTERHUB_API_TOKEN")
    if not token:
        fail("JUPYTERHUB_API_TOKEN is not set: run gpu-job inside a notebook server of the hub")
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Authorization": f"token {token}",
                                          "Content-Type": "application/json"})
    try:
        response = urllib.request.urlopen(req, timeout=None if stream else 120)
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("message") or exc.reason
        except ValueError:
            message = exc.reason
        fail(f"{message} (HTTP {exc.code})")
    except urllib.error.URLError as exc:
        fail(f"cannot reach the hub's job service at {args.url}: {exc.reason}")
    if stream:
        return response
    return json.loads(response.read() or b"null")


def workdir_here():
    """The current directory relative to $HOME, or "" (the home) when outside it."""
    home = os.path.realpath(os.environ.get("HOME", "/home/jovyan"))
    here = os.path.realpath(os.getcwd())
    if here == home or not here.startswith(home + os.sep):
        return ""
    return os.path.relpath(here, home)


def show(job):
    gpus = ", ".join(job.get("gpus") or []) or "none"
    line = f"job {job['id']}: {job['state']}"
    if job.get("queue_position"):
        line += f" (position {job['queue_position']} in the queue)"
    if job.get("exit_code") is not None:
        line += f", exit code {job['exit_code']}"
    if (job.get("attempts") or 1) > 1:
        line += f", attempt {job['attempts']}"
    print(line)
    if job.get("borrowed_notice"):
        print(f"  {job['borrowed_notice']}")
    print(f"  profile {job['profile']}, GPUs {gpus}, command {' '.join(job['command'])}")
    for unit in job.get("units") or []:
        print(f"  worker {unit['worker']}{' (chief)' if unit['worker'] == 0 else ''}: host {unit['host']}, "
              f"GPUs {', '.join(unit['gpus']) or 'none'}")
    print(f"  submitted {job['submitted_at']}, started {job.get('started_at') or '-'}, "
          f"ended {job.get('ended_at') or '-'}")
    if job.get("message"):
        print(f"  {job['message']}")


def build_parser():
    """The command line (docs/reference/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(prog="gpu-job", description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("GPUHUB_JOBS_URL", ""),
                        help="the gpu-pool service (default: $GPUHUB_JOBS_URL)")
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("submit", help="queue a job: gpu-job submit --profile P -- COMMAND...")
    p.add_argument("--profile", required=True, help="a profile's slug, e.g. tf-gpu-1")
    p.add_argument("--workdir", default=None, help="directory inside your home (default: the current one)")
    p.add_argument("--timeout", type=int, default=None, help="seconds before it is stopped")
    p.add_argument("--workers", type=int, default=None,
                   help="a cluster of N containers, each with the profile's GPUs and TF_CONFIG (default 1)")
    p.add_argument("--borrow", action="store_true",
                   help="may run on idle GPUs beyond your share; they are reclaimed with notice (SIGTERM) "
                        "when someone within their share needs them")
    p.add_argument("--no-requeue", dest="requeue", action="store_false",
                   help="once reclaimed, end the job instead of queueing it again")
    p.add_argument("--json", action="store_true", help="print the job as JSON")
    p.add_argument("command", nargs=argparse.REMAINDER)
    for name in ("status", "cancel"):
        q = sub.add_parser(name, help=f"{name} of a job")
        q.add_argument("job", type=int)
        q.add_argument("--json", action="store_true")
    q = sub.add_parser("logs", help="a job's output")
    q.add_argument("job", type=int)
    q.add_argument("-f", "--follow", action="store_true", help="stream it until the job ends")
    q.add_argument("--worker", type=int, default=None,
                   help="a cluster's worker i only (default: every worker, lines marked [worker i], "
                        "followed or not)")
    q = sub.add_parser("list", help="your jobs, newest first")
    q.add_argument("--json", action="store_true")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if not args.url:
        fail("GPUHUB_JOBS_URL is not set (the hub sets it in its notebook servers); pass --url")

    if args.action == "submit":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            fail("give the command after --, e.g. gpu-job submit --profile tf-gpu-1 -- python train.py")
        body = {"profile": args.profile, "command": command,
                "workdir": workdir_here() if args.workdir is None else args.workdir}
        if args.timeout is not None:
            body["timeout"] = args.timeout
        if args.workers is not None:
            body["workers"] = args.workers
        if args.borrow:
            body["borrow"] = True
        if not args.requeue:
            body["requeue"] = False
        job = request(args, "POST", "", body)
        print(json.dumps(job, indent=2)) if args.json else show(job)
    elif args.action in ("status", "cancel"):
        job = request(args, "GET" if args.action == "status" else "DELETE", f"/{args.job}")
        print(json.dumps(job, indent=2)) if args.json else show(job)
    elif args.action == "logs":
        query = [q for q in ("follow=1" if args.follow else "",
                             f"worker={args.worker}" if args.worker is not None else "") if q]
        response = request(args, "GET", f"/{args.job}/logs" + ("?" + "&".join(query) if query else ""),
                           stream=True)
        while chunk := response.read1(65536) if hasattr(response, "read1") else response.read(65536):
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
    elif args.action == "list":
        jobs = request(args, "GET", "")["jobs"]
        if args.json:
            print(json.dumps(jobs, indent=2))
        for job in [] if args.json else jobs:
            workers = f"x{job['workers']}" if job.get("workers", 1) > 1 else ""
            print(f"{job['id']:>6}  {job['state']:<10} {job['profile'] + workers:<12} {' '.join(job['command'])[:60]}")


if __name__ == "__main__":
    main()
