"""gpu-job: run a command on leased GPUs as a batch job, from a notebook server's terminal.

    gpu-job submit --profile tf-gpu-1 -- python train.py --epochs 5 --model_path model.keras
    gpu-job submit --profile tf-gpu-1 --notebook train.ipynb -p epochs 5
    gpu-job schedule create --cron "0 3 * * *" --profile tf-gpu-1 --notebook train.ipynb -p epochs 5
    gpu-job logs -f 12        # follow job 12's output until it ends
    gpu-job status 12         # state, exit code, GPUs, times
    gpu-job cancel 12
    gpu-job list

A notebook runs with papermill; the executed copy (and an HTML one) lands beside it,
train.job-12.ipynb and train.job-12.html.  A schedule fires on the hub even while your
server is stopped (`gpu-job schedule list / pause / resume / delete`).

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


def request(args, method, path, body=None, stream=False, api="jobs"):
    url = args.url.rstrip("/") + f"/api/{api}" + path
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


def home_path(path):
    """A path given on the command line (relative to the current directory) as relative to
    $HOME; one outside the home is sent as it is, and the hub says why it is refused."""
    home = os.path.abspath(os.environ.get("HOME", "/home/jovyan"))
    full = os.path.abspath(path)
    return os.path.relpath(full, home) if full.startswith(home + os.sep) else path


def parameter_value(text):
    """A -p value as papermill reads one: JSON when it parses (5, 0.1, true, "x"), else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def job_body(args, command):
    """What api/jobs (and api/schedules) take from `submit`'s and `schedule create`'s options."""
    body = {"profile": args.profile}
    if args.notebook:
        if command:
            fail("give either --notebook or a command after --, not both")
        body["notebook"] = home_path(args.notebook)
        if args.parameter:
            body["parameters"] = {name: parameter_value(value) for name, value in args.parameter}
    else:
        if not command:
            fail("give the command after --, e.g. gpu-job submit --profile tf-gpu-1 -- python train.py, "
                 "or --notebook NB")
        if args.parameter:
            fail("-p is for a notebook (--notebook NB)")
        body["command"] = command
        body["workdir"] = workdir_here() if args.workdir is None else args.workdir
    if args.timeout is not None:
        body["timeout"] = args.timeout
    return body


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
    if job.get("schedule_id"):
        line += f" (fired by schedule {job['schedule_id']})"
    if job.get("queue_position"):
        line += f" (position {job['queue_position']} in the queue)"
    if job.get("exit_code") is not None:
        line += f", exit code {job['exit_code']}"
    if (job.get("attempts") or 1) > 1:
        line += f", attempt {job['attempts']}"
    print(line)
    if job.get("borrowed_notice"):
        print(f"  {job['borrowed_notice']}")
    what = (f"notebook {job['notebook']}" if job.get("notebook") else f"command {' '.join(job['command'])}")
    print(f"  profile {job['profile']}, GPUs {gpus}, {what}")
    if job.get("notebook"):
        print(f"  output {job['output']} (and {job['output_html']})")
    for unit in job.get("units") or []:
        print(f"  worker {unit['worker']}{' (chief)' if unit['worker'] == 0 else ''}: host {unit['host']}, "
              f"GPUs {', '.join(unit['gpus']) or 'none'}")
    print(f"  submitted {job['submitted_at']}, started {job.get('started_at') or '-'}, "
          f"ended {job.get('ended_at') or '-'}")
    if job.get("message"):
        print(f"  {job['message']}")


def show_schedule(schedule):
    state = "paused" if schedule["paused"] else f"next {schedule.get('next_at') or '-'}"
    print(f"schedule {schedule['id']}: {schedule['name']!r}, cron {schedule['cron']!r} (UTC), {state}")
    what = (f"notebook {schedule['notebook']}" if schedule.get("notebook")
            else f"command {' '.join(schedule.get('command') or [])}")
    print(f"  profile {schedule['profile']}, {what}, fired {schedule['fired']} time(s)"
          + (f", last job {schedule['last_job_id']}" if schedule.get("last_job_id") else ""))
    if schedule.get("last_error"):
        print(f"  last firing made no job: {schedule['last_error']}")


def job_options(p):
    p.add_argument("--profile", required=True, help="a profile's slug, e.g. tf-gpu-1")
    p.add_argument("--notebook", default=None, help="run this notebook (in your home) with papermill")
    p.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   help="a notebook parameter (repeat for more); VALUE is read as JSON when it parses")
    p.add_argument("--workdir", default=None, help="directory inside your home (default: the current one)")
    p.add_argument("--timeout", type=int, default=None, help="seconds before it is stopped")


def build_parser():
    """The command line (docs/reference/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(prog="gpu-job", description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("GPUHUB_JOBS_URL", ""),
                        help="the gpu-pool service (default: $GPUHUB_JOBS_URL)")
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("submit", help="queue a job: gpu-job submit --profile P -- COMMAND... (or --notebook NB)")
    job_options(p)
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
    s = sub.add_parser("schedule", help="jobs the hub fires on a cron string, even with your server stopped")
    ss = s.add_subparsers(dest="schedule_action", required=True)
    q = ss.add_parser("create", help="gpu-job schedule create --cron CRON --profile P (--notebook NB | -- COMMAND...)")
    q.add_argument("--cron", required=True, help='five fields in UTC, e.g. "0 3 * * *" (every night at 03:00)')
    q.add_argument("--name", default=None, help="a name to tell it by")
    job_options(q)
    q.add_argument("--json", action="store_true")
    q.add_argument("command", nargs=argparse.REMAINDER)
    q = ss.add_parser("list", help="your schedules")
    q.add_argument("--json", action="store_true")
    for name in ("pause", "resume", "delete"):
        q = ss.add_parser(name, help=f"{name} a schedule")
        q.add_argument("schedule", type=int)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if not args.url:
        fail("GPUHUB_JOBS_URL is not set (the hub sets it in its notebook servers); pass --url")

    if args.action == "submit":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        body = job_body(args, command)
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
    elif args.action == "schedule":
        schedule(args)


def schedule(args):
    action = args.schedule_action
    if action == "create":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        body = {"cron": args.cron, **job_body(args, command)}
        if args.name:
            body["name"] = args.name
        made = request(args, "POST", "", body, api="schedules")
        print(json.dumps(made, indent=2)) if args.json else show_schedule(made)
    elif action == "list":
        found = request(args, "GET", "", api="schedules")["schedules"]
        if args.json:
            print(json.dumps(found, indent=2))
        for one in [] if args.json else found:
            show_schedule(one)
    elif action == "delete":
        request(args, "DELETE", f"/{args.schedule}", api="schedules")
        print(f"schedule {args.schedule} deleted")
    else:
        show_schedule(request(args, "POST", f"/{args.schedule}/{action}", {}, api="schedules"))


if __name__ == "__main__":
    main()
