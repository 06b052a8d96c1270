"""``jupyter gpusched submit|queue|cancel|logs|nodes``: the REST API from a terminal.

Each subcommand finds the running server (``--url``/``--token``, ``$GPUSCHED_URL``, or the
running-server files ``jupyter server list`` reads). Exit codes: 0 ok, 1 the server refused or
could not be reached (one line on stderr says why), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, NoReturn

from jupyter_gpusched.client.api import GpuSchedClient, find_server
from jupyter_gpusched.core.errors import GpuSchedError
from jupyter_gpusched.core.units import format_duration_s, parse_duration_s, parse_size_gb

#: GPU state -> glyph in the ``nodes`` map; lower case when the GPU is only partly taken.
GLYPHS = {"free": ".", "interactive": "I", "batch": "B", "foreign": "F", "down": "x"}


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _parser(name: str, description: str) -> _Parser:
    parser = _Parser(prog=f"jupyter gpusched {name}", description=description)
    parser.add_argument(
        "--url",
        help="server URL with base_url (default: $GPUSCHED_URL or "
        "the running server found like 'jupyter server list')",
    )
    parser.add_argument("--token", help="server token (default: $GPUSCHED_TOKEN or discovered)")
    return parser


def _run(
    argv: list[str],
    parser: _Parser,
    action: Callable[[GpuSchedClient, Any], int],
    check: Callable[[Any], None] | None = None,
) -> int:
    """Parse (and ``check``) the arguments before finding the server, then act."""
    try:
        args = parser.parse_args(argv)
        if check is not None:
            check(args)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return int(exc.code or 0)
    try:
        info = find_server(args.url, args.token)
        return action(GpuSchedClient(info.url, info.token), args)
    except GpuSchedError as exc:
        print(f"{parser.prog}: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


# ---------------------------------------------------------------------------- submit


def add_resource_args(p: argparse.ArgumentParser) -> None:
    """What a job needs: GPUs (whole, by memory or a share), CPUs, host memory, models."""
    p.add_argument("--gpus", type=int, default=1, help="GPUs, all on one node (default 1)")
    p.add_argument("--mem", type=size_arg, help="GPU memory needed on each GPU, e.g. 16G")
    p.add_argument("--share", type=float, help="share of one GPU (0-1], e.g. 0.5")
    p.add_argument("--cpus", type=float, help="CPU cores (default 1)")
    p.add_argument("--host-mem", type=size_arg, help="host memory, e.g. 32G (default 4G)")
    p.add_argument("--model", action="append", default=[], help="allowed GPU model (repeat)")


def submit_main(argv: list[str]) -> int:
    """``submit [options] -- COMMAND...``: queue a script."""
    p = _parser(
        "submit",
        "Queue a script on the GPU cluster, e.g. "
        "'jupyter gpusched submit --gpus 2 --mem 16G -- python train.py'.",
    )
    add_resource_args(p)
    p.add_argument("--name", help="display name")
    p.add_argument("--priority", choices=("interactive", "batch"), help="priority class")
    p.add_argument("--max-runtime", type=duration_arg, help="stop after this long, e.g. 2h")
    p.add_argument("--at", type=_when, help="do not start before this ISO time (with zone)")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="environment variable for the job (repeat)",
    )
    p.add_argument("--workdir", help="working directory on the node")
    p.add_argument("--retries", type=int, help="requeue this many times if the node is lost")
    p.add_argument("--json", action="store_true", help="print the job as JSON")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")

    def check(args: Any) -> None:
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            p.error("give the command to run after --, e.g. -- python train.py")
        env = {}
        for item in args.env:
            name, sep, value = item.partition("=")
            if not sep:
                p.error(f"--env {item!r}: write it as NAME=VALUE")
            env[name] = value
        spec: dict[str, Any] = {"kind": "script", "command": command, "gpus": args.gpus}
        optional = {
            "gpu_mem_gb": args.mem,
            "gpu_share": args.share,
            "cpus": args.cpus,
            "mem_gb": args.host_mem,
            "name": args.name,
            "priority": args.priority,
            "max_runtime_s": args.max_runtime,
            "not_before": args.at,
            "workdir": args.workdir,
            "retries": args.retries,
            "gpu_models": args.model or None,
            "env": env or None,
        }
        spec.update({k: v for k, v in optional.items() if v is not None})
        args.spec = spec

    def action(client: GpuSchedClient, args: Any) -> int:
        job = client.submit(args.spec)
        if args.json:
            print(json.dumps(job, indent=2))
        else:
            where = f", position {job['position']}" if job.get("position") else ""
            print(f"submitted job {job['id']} ({job['state']}{where})")
        return 0

    return _run(argv, p, action, check)


# ---------------------------------------------------------------------------- queue


def queue_main(argv: list[str]) -> int:
    """``queue``: a table of queued and running jobs."""
    p = _parser("queue", "Show the queue: queued and running jobs (--all for finished too).")
    p.add_argument("--all", action="store_true", help="include finished jobs")
    p.add_argument("--state", help="comma-separated states, e.g. queued,running")
    p.add_argument("--user", help="only this user's jobs ('me' for yours)")
    p.add_argument("--limit", type=int, default=100, help="at most this many rows (default 100)")
    p.add_argument("--json", action="store_true", help="print the API's JSON")

    def action(client: GpuSchedClient, args: Any) -> int:
        state = args.state or (None if args.all else "queued,starting,running")
        page = client.list_jobs(state=state, user=args.user, limit=args.limit)
        if args.json:
            print(json.dumps(page, indent=2))
        else:
            print(format_queue(page["jobs"], total=page["total"]))
        return 0

    return _run(argv, p, action)


def format_queue(jobs: list[dict[str, Any]], *, total: int | None = None) -> str:
    """The ``queue`` table: one row per job, the reason it waits or failed at the end."""
    if not jobs:
        return "no jobs"
    header = ("ID", "USER", "KIND", "STATE", "GPUS", "NODE", "AGE", "WHAT", "WHY")
    rows = [header]
    now = datetime.now(UTC)
    for job in jobs:
        spec = job["spec"]
        placement = job.get("placement") or {}
        gpus = str(spec.get("gpus", ""))
        if spec.get("gpu_share") and spec["gpu_share"] < 1:
            gpus = f"{spec['gpu_share']:g}"
        what = spec.get("name") or " ".join(spec.get("command") or []) or spec.get("notebook") or ""
        why = job.get("reason") or ""
        if job.get("position"):
            why = f"#{job['position']} {why}".strip()
        if job.get("held"):
            why = f"held {why}".strip()
        if job.get("exit_code") not in (None, 0):
            why = why or f"exit {job['exit_code']}"
        rows.append(
            (
                str(job["id"]),
                job.get("user", ""),
                spec["kind"],
                job["state"],
                gpus,
                placement.get("node", "") + _gpu_list(placement),
                _age(job["submitted_at"], now),
                _clip(what, 30),
                _clip(why, 60),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if total is not None and total > len(jobs):
        lines.append(f"... {total - len(jobs)} more (use --limit)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- cancel, logs


def cancel_main(argv: list[str]) -> int:
    """``cancel ID...``: cancel jobs."""
    p = _parser("cancel", "Cancel queued or running jobs.")
    p.add_argument("ids", nargs="+", type=int, metavar="ID", help="job ids")

    def action(client: GpuSchedClient, args: Any) -> int:
        for job_id in args.ids:
            job = client.cancel(job_id)
            print(f"job {job['id']} {job['state']}")
        return 0

    return _run(argv, p, action)


def logs_main(argv: list[str]) -> int:
    """``logs ID [-f]``: print a job's output."""
    p = _parser("logs", "Print a job's combined stdout and stderr.")
    p.add_argument("id", type=int, metavar="ID", help="job id")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    p.add_argument("--offset", type=int, default=0, help="start at this byte")

    def action(client: GpuSchedClient, args: Any) -> int:
        out = sys.stdout.buffer
        if args.follow:
            for chunk in client.follow_log(args.id, offset=args.offset):
                out.write(chunk)
                out.flush()
            return 0
        offset = args.offset
        while True:
            data, offset = client.read_log(args.id, offset=offset, limit=1 << 20)
            out.write(data)
            if len(data) < 1 << 20:
                break
        out.flush()
        return 0

    return _run(argv, p, action)


# ---------------------------------------------------------------------------- nodes


def nodes_main(argv: list[str]) -> int:
    """``nodes``: a text map of the cluster, one line per node, one glyph per GPU."""
    p = _parser("nodes", "Show the cluster: one line per node, one glyph per GPU.")
    p.add_argument("--json", action="store_true", help="print the API's JSON")

    def action(client: GpuSchedClient, args: Any) -> int:
        cluster = client.cluster()
        print(json.dumps(cluster, indent=2) if args.json else format_cluster(cluster))
        return 0

    return _run(argv, p, action)


def format_cluster(cluster: dict[str, Any]) -> str:
    """The ``nodes`` map: glyphs per GPU, free count, then figures and the window."""
    rows = []
    for node in cluster["nodes"]:
        gpus = node["gpus"]
        glyphs = "".join(_glyph(g) for g in gpus)
        free = sum(1 for g in gpus if g["state"] == "free")
        model = gpus[0]["model"] if gpus else "-"
        status = "up" if node["up"] else f"DOWN {node.get('error') or ''}".strip()
        rows.append((node["name"], model, f"[{glyphs}]", f"{free}/{len(gpus)} free", status))
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.append(
        "legend: . free  I interactive  B batch  F foreign  x down (lower case: GPU partly shared)"
    )
    m, q, w = cluster.get("metrics", {}), cluster.get("queue", {}), cluster.get("window", {})
    lines.append(
        f"gpus: {m.get('gpus_free', '?')}/{m.get('gpus_total', '?')} free, largest placeable "
        f"job {m.get('largest_placeable_gpus', '?')} GPUs, fragmentation "
        f"{_num(m.get('frag_ratio'))}; queue: {q.get('queued', 0)} queued, "
        f"{q.get('running', 0)} running"
    )
    if w:
        until = f" until {w['until']}" if w.get("until") else ""
        nxt = f", then {w['next']}" if w.get("next") else ""
        lines.append(f"window: {w.get('name')}{until}{nxt}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- helpers


def _glyph(gpu: dict[str, Any]) -> str:
    glyph = GLYPHS.get(gpu["state"], "?")
    if gpu["state"] in ("interactive", "batch") and gpu.get("share_used", 1) < 1:
        glyph = glyph.lower()
    return glyph


def _gpu_list(placement: dict[str, Any]) -> str:
    idx = placement.get("gpu_indices") or []
    return f":{','.join(map(str, idx))}" if idx else ""


def _age(iso: str, now: datetime) -> str:
    try:
        seconds = max(0, int((now - datetime.fromisoformat(iso)).total_seconds()))
    except (TypeError, ValueError):
        return ""
    return format_duration_s(seconds, parts=1)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _num(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "?"


def size_arg(text: str) -> float:
    """Argparse type for sizes like 16G, keeping our message on errors."""
    try:
        return parse_size_gb(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def duration_arg(text: str) -> float:
    """Argparse type for durations like 2h, keeping our message on errors."""
    try:
        return parse_duration_s(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _when(text: str) -> str:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO time") from None
    if when.tzinfo is None:
        raise argparse.ArgumentTypeError("needs a timezone, e.g. 2026-11-23T22:00:00+01:00")
    return when.isoformat()
