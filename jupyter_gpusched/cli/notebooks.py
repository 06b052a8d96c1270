"""``jupyter gpusched submit-notebook|definitions``: notebook jobs and schedules from a terminal.

Also the small client functions the example notebook and other tools use
(:func:`submit_notebook`, :func:`list_definitions`, ...), one per notebook route of the API.
Exit codes as the other subcommands: 0 ok, 1 refused or unreachable, 2 bad arguments.
"""

from __future__ import annotations

import ast
import json
import os
import sys
from typing import Any

from jupyter_gpusched.client.api import GpuSchedClient

from .jobs import _parser, _run, add_resource_args, duration_arg

# ---------------------------------------------------------------------------- client calls


def submit_notebook(client: GpuSchedClient, notebook: str, **fields: Any) -> dict[str, Any]:
    """``POST notebooks``: ``{"job": Job|None, "definition": Definition|None}``.

    ``notebook`` is a path under the server's root (absolute paths inside it work too);
    ``fields`` are the other request fields (parameters, at, gpus, ...).
    """
    return dict(client._json("POST", "notebooks", body={"notebook": notebook, **fields}))


def list_definitions(client: GpuSchedClient, *, user: str | None = None) -> list[dict[str, Any]]:
    """``GET definitions``: every definition (``user="me"`` for the caller's)."""
    answer = client._json("GET", "definitions", query={"user": user, "limit": 1000})
    return list(answer["definitions"])


def get_definition(client: GpuSchedClient, definition_id: int) -> dict[str, Any]:
    """``GET definitions/{id}``."""
    return dict(client._json("GET", f"definitions/{int(definition_id)}"))


def update_definition(client: GpuSchedClient, definition_id: int, **changes: Any) -> dict:
    """``PATCH definitions/{id}``: paused, schedule, timezone, catch_up, name."""
    return dict(client._json("PATCH", f"definitions/{int(definition_id)}", body=changes))


def delete_definition(client: GpuSchedClient, definition_id: int) -> dict[str, Any]:
    """``DELETE definitions/{id}``."""
    return dict(client._json("DELETE", f"definitions/{int(definition_id)}"))


def parse_parameter(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` with a typed value: JSON or a Python literal, else the text itself.

    ``lr=0.1`` -> float, ``epochs=3`` -> int, ``fast=true`` / ``fast=True`` -> bool,
    ``layers=[64,32]`` -> list, ``cfg={"a": 1}`` -> dict, ``name=resnet`` -> str.
    """
    name, sep, raw = text.partition("=")
    name = name.strip()
    if not sep or not name.isidentifier():
        raise ValueError(f"{text!r} is not NAME=VALUE with a valid variable name")
    for parse in (json.loads, ast.literal_eval):
        try:
            return name, parse(raw)
        except (ValueError, SyntaxError, RecursionError):
            continue
    return name, raw


# ---------------------------------------------------------------------------- submit-notebook


def add_notebook_args(p: Any) -> None:
    """What a notebook run needs, the same for the CLI and ``%gpu submit-notebook``."""
    p.add_argument("notebook", help="path of the .ipynb to run")
    p.add_argument(
        "-p",
        "--parameter",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a parameter; VALUE is read as JSON or a Python literal, else text: "
        "lr=0.1, epochs=3, tag=base",
    )
    p.add_argument(
        "--at",
        default="now",
        help="now, tonight, a window name, an ISO time or a "
        "cron expression like '0 2 * * *' (a recurring definition)",
    )
    p.add_argument("--kernel", help="kernel name (default: the notebook's)")
    p.add_argument("--name", help="display name")


def submit_main(argv: list[str]) -> int:
    """``submit-notebook NB [-p NAME=VALUE ...] [--gpus N] [--at WHEN]``."""
    import argparse

    p = _parser(
        "submit-notebook",
        "Run a notebook on the GPU cluster as a batch job, e.g. "
        "'jupyter gpusched submit-notebook train.ipynb -p lr=0.1 --gpus 2 --at tonight'. "
        "The executed notebook comes back beside it.",
    )
    add_notebook_args(p)
    p.add_argument("--parameters-json", help="all parameters as one JSON object")
    p.add_argument("--timezone", help="timezone of the cron (default: the policy's)")
    p.add_argument("--catch-up", choices=("skip", "once"), help="after downtime (cron only)")
    add_resource_args(p)
    p.add_argument(
        "--cell-timeout", type=duration_arg, help="stop a cell after this long, e.g. 10m"
    )
    p.add_argument("--max-runtime", type=duration_arg, help="stop the run after this long, e.g. 2h")
    p.add_argument("--retries", type=int, help="run a failed notebook again this many times")
    p.add_argument("--retry-backoff", type=duration_arg, help="first wait before a retry (1m)")
    p.add_argument("--priority", choices=("interactive", "batch"), help="priority class")
    p.add_argument("--wait", action="store_true", help="wait for the run; exit 1 if it failed")
    p.add_argument("--json", action="store_true", help="print the API's JSON")

    def check(args: Any) -> None:
        try:
            args.parameters = dict(parse_parameter(t) for t in args.parameter)
            if args.parameters_json:
                extra = json.loads(args.parameters_json)
                if not isinstance(extra, dict):
                    raise ValueError("--parameters-json must be a JSON object")
                args.parameters = {**extra, **args.parameters}
        except ValueError as exc:
            p.error(str(exc))

    def action(client: GpuSchedClient, args: argparse.Namespace) -> int:
        fields: dict[str, Any] = {"parameters": args.parameters, "at": args.at, "gpus": args.gpus}
        optional = {
            "timezone": args.timezone,
            "catch_up": args.catch_up,
            "gpu_mem_gb": args.mem,
            "gpu_share": args.share,
            "cpus": args.cpus,
            "mem_gb": args.host_mem,
            "kernel_name": args.kernel,
            "cell_timeout_s": args.cell_timeout,
            "max_runtime_s": args.max_runtime,
            "retries": args.retries,
            "retry_backoff_s": args.retry_backoff,
            "name": args.name,
            "priority": args.priority,
            "gpu_models": args.model or None,
        }
        fields.update({k: v for k, v in optional.items() if v is not None})
        answer = submit_notebook(client, os.path.abspath(args.notebook), **fields)
        job, definition = answer["job"], answer["definition"]
        if job is not None and args.wait:
            job = wait_for_output(client, job["id"])
        if args.json:
            print(json.dumps(job or definition, indent=2))
        elif job is not None:
            print(_job_line(job))
        else:
            print(_definition_line(definition))
        return 0 if job is None or not args.wait or job["state"] == "succeeded" else 1

    return _run(argv, p, action, check)


def wait_for_output(client: GpuSchedClient, job_id: int, timeout_s: float = 3600.0) -> dict:
    """The job once ended and its executed notebook is back (or a few seconds after)."""
    import time

    job = client.wait(job_id, timeout_s=timeout_s)
    deadline = time.monotonic() + 30.0
    while "output_notebook" not in job["spec"]["labels"] and time.monotonic() < deadline:
        time.sleep(0.3)
        job = client.get_job(job_id)
    return job


def _job_line(job: dict[str, Any]) -> str:
    labels = job["spec"]["labels"]
    text = f"job {job['id']} {job['state']}: {job['spec']['notebook']}"
    if job["spec"].get("not_before"):
        text += f" (not before {job['spec']['not_before']})"
    if "output_notebook" in labels:
        text += f" -> {labels['output_notebook']}"
    return text


def _definition_line(d: dict[str, Any]) -> str:
    state = "paused" if d["paused"] else f"next {d['next_fire_at']}"
    return (
        f"definition {d['id']} [{d['user']}] {d['schedule']!r} {d['timezone']} "
        f"catch-up {d['catch_up']}: {d['spec']['notebook']} ({state}, "
        f"{d['fire_count']} runs)"
    )


# ---------------------------------------------------------------------------- definitions


def definitions_main(argv: list[str]) -> int:
    """``definitions [list|show|pause|resume|delete] [ID ...]``."""
    import argparse

    p = _parser("definitions", "List, show, pause, resume or delete recurring notebook jobs.")
    p.add_argument(
        "verb", nargs="?", default="list", choices=("list", "show", "pause", "resume", "delete")
    )
    p.add_argument("ids", nargs="*", type=int, metavar="ID", help="definition ids")
    p.add_argument("--user", help="list only this user's ('me' for yours)")
    p.add_argument("--json", action="store_true", help="print the API's JSON")

    def check(args: Any) -> None:
        if args.verb != "list" and not args.ids:
            p.error(f"{args.verb} needs at least one definition ID")

    def action(client: GpuSchedClient, args: argparse.Namespace) -> int:
        if args.verb == "list":
            items = list_definitions(client, user=args.user)
            if args.json:
                print(json.dumps(items, indent=2))
            else:
                print("\n".join(_definition_line(d) for d in items) or "no definitions")
            return 0
        for def_id in args.ids:
            if args.verb == "show":
                d = get_definition(client, def_id)
            elif args.verb == "delete":
                d = delete_definition(client, def_id)
            else:
                d = update_definition(client, def_id, paused=args.verb == "pause")
            if args.json:
                print(json.dumps(d, indent=2))
            else:
                print(("deleted " if args.verb == "delete" else "") + _definition_line(d))
                if args.verb == "show":
                    for run in d["runs"]:
                        print(
                            f"  {run['fire_at']}: job {run['job_id']}"
                            + (" (caught up)" if run.get("caught_up") else "")
                        )
        return 0

    return _run(argv, p, action, check)


if __name__ == "__main__":
    sys.exit(submit_main(sys.argv[1:]))
