"""The node agent: ``python -m jupyter_gpusched.node.agent probe|launch|status|kill|log|...``.

Runs on each GPU node over SSH, so it imports only the standard library (plus pynvml when the
node has it) and may run under the node's system Python. Every subcommand prints one JSON
object on stdout; errors print ``{"error": ...}`` and exit 1. ``log`` is the exception: it
writes raw log bytes.

It is the one entry point the scheduler runs as a job's owner (``gpusched-agent``, the console
script, is what a sudoers line names): staging, launch, status, kill, logs, claims and lease
kernel connection files all go through it. Whatever it creates is private to the user it runs
as (umask 077, job dirs 0700); the job itself gets the umask the agent was started with.

The jobs themselves (the wrapper, launch, claims, status, kill, logs) are :mod:`.jobs`.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from typing import IO, Any

from .jobs import claim, is_running, kill, launch, log, status
from .probe import AgentError, probe
from .stage import stage

# The kernel helpers are imported by the subcommand that uses them: every poll starts this
# module on the node (unless an agent is serving), so its start-up time is paid per call.

__all__ = [  # the jobs' functions too: tests and callers know them as the agent's
    "SERVED",
    "claim",
    "is_running",
    "kill",
    "launch",
    "log",
    "main",
    "serve",
    "status",
]


def _read_spec(path: str, stdin: IO[str]) -> tuple[list[str], list[str], dict[str, Any] | None]:
    """Argv, ``KEY=VALUE`` strings and parameters from a launch spec.

    The scheduler sends every launch's spec this way (on stdin), not as arguments: big ones
    would not fit, and env values and parameters must never stand on a command line, which
    every user of the node can read (``ps``).
    """
    if path == "-":
        data = json.load(stdin)
    else:
        with open(path) as f:
            data = json.load(f)
    argv, env = data.get("argv"), data.get("env") or {}
    parameters = data.get("parameters")
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise AgentError("the launch spec's argv must be a list of strings")
    if not isinstance(env, dict):
        raise AgentError("the launch spec's env must be an object")
    if parameters is not None and not isinstance(parameters, dict):
        raise AgentError("the launch spec's parameters must be an object")
    return argv, [f"{k}={v}" for k, v in env.items()], parameters


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jupyter_gpusched.node.agent")
    p.add_argument(
        "--setenv",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set in this agent's environment first (the node's env when sudo reset it)",
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("probe", help="report this node's GPUs as JSON")
    lp = sub.add_parser("launch", help="start a job detached")
    lp.add_argument("--job-dir", required=True)
    lp.add_argument("--cwd")
    lp.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    lp.add_argument("--gpus", help="comma-separated GPU UUIDs or indices for CUDA_VISIBLE_DEVICES")
    lp.add_argument("--log")
    lp.add_argument(
        "--spec",
        metavar="FILE",
        help='JSON {"argv": [...], "env": {...}, "parameters": {...}} to launch; - = stdin',
    )
    lp.add_argument(
        "--accounts-checked",
        metavar="FINGERPRINT",
        help="sudo allowed this agent's user after this accounts fingerprint was taken "
        "(serve --watch-accounts)",
    )
    lp.add_argument("argv", nargs=argparse.REMAINDER)
    cp = sub.add_parser("claim", help="a job dir's launch record, or claim it so none starts")
    cp.add_argument("--job-dir", required=True)
    sp = sub.add_parser("status", help="is a job running; its exit code once ended")
    sp.add_argument("--job-dir", required=True)
    sp.add_argument("--pid", type=int, required=True)
    sp.add_argument("--start-time", type=int)
    kp = sub.add_parser("kill", help="TERM a process group, KILL after a grace period")
    kp.add_argument("--pgid", type=int, required=True)
    kp.add_argument("--grace", type=float, default=10.0)
    kp.add_argument("--job-dir")
    gp = sub.add_parser("log", help="print a job's log from an offset; --follow to stream")
    gp.add_argument("--file", required=True)
    gp.add_argument("--offset", type=int, default=0)
    gp.add_argument("--limit", type=int)
    gp.add_argument("--follow", action="store_true")
    gp.add_argument("--job-dir")
    gp.add_argument("--pid", type=int)
    gp.add_argument("--start-time", type=int)
    st = sub.add_parser("stage", help="unpack a tar on stdin into a job dir (0700)")
    st.add_argument("--job-dir", required=True)
    np = sub.add_parser("connection", help="a lease kernel's connection info once it is ready")
    np.add_argument("--path", required=True)
    np.add_argument("--timeout", type=float, default=30.0)
    rp = sub.add_parser("remove", help="remove a file (a lease kernel's connection file)")
    rp.add_argument("--path", required=True)
    sv = sub.add_parser("serve", help=f"answer {', '.join(SERVED)} requests, a JSON line each")
    sv.add_argument(
        "--watch-accounts",
        action="store_true",
        help="started through sudo: launch nothing once the files deciding whom sudo runs "
        "the agent as changed, until the scheduler asked sudo again (see node/accounts.py)",
    )
    return p


def _as_started(setenv: list[str]) -> int:
    """Environment, umask and directory for this run; the umask the agent was started with.

    Under sudo (``SUDO_USER`` set) the agent starts where the scheduler's account was; it moves
    to its own user's home, as an SSH login would, and drops sudo's variables.
    """
    for item in setenv:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise AgentError(f"--setenv {item!r} is not KEY=VALUE")
        os.environ[key] = value
    if "SUDO_USER" in os.environ:
        for key in ("SUDO_USER", "SUDO_UID", "SUDO_GID", "SUDO_COMMAND"):
            os.environ.pop(key, None)
        os.chdir(os.path.expanduser("~"))
    return os.umask(0o077)


def _remove(path: str) -> dict[str, Any]:
    try:
        os.unlink(os.path.expanduser(path))
    except FileNotFoundError:
        return {"removed": False}
    return {"removed": True}


def _command(args: argparse.Namespace, umask: int, stdin: IO[str]) -> dict[str, Any]:
    """One subcommand's JSON answer (all but ``log`` and ``serve``)."""
    if args.cmd == "probe":
        return probe()
    if args.cmd == "claim":
        return claim(args.job_dir)
    if args.cmd == "launch":
        command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        env = list(args.env)
        parameters = None
        if args.spec:
            command, more, parameters = _read_spec(args.spec, stdin)
            env += more
        return launch(
            args.job_dir,
            command,
            cwd=args.cwd,
            env=env,
            gpus=args.gpus,
            log=args.log,
            umask=umask,
            parameters=parameters,
        )
    if args.cmd == "status":
        return status(args.job_dir, args.pid, args.start_time)
    if args.cmd == "kill":
        return kill(args.pgid, args.grace, args.job_dir)
    if args.cmd == "stage":
        return stage(args.job_dir, sys.stdin.buffer)
    if args.cmd == "connection":
        from .kernel import wait_connection

        return wait_connection(args.path, args.timeout)
    return _remove(args.path)


#: The subcommands a serving agent answers: quick ones, never blocking the next request.
SERVED = ("launch", "status", "remove")


def serve(umask: int, *, watch_accounts: bool = False) -> int:
    """Answer requests on stdin until it closes: ``{"args": [...], "input": "..."}`` per line.

    Each answer is one line ``{"exit": 0|1, "answer": {...}}``, in the order asked. The
    scheduler keeps one serving agent per node and account on its pooled connection, so a
    launch costs a line each way instead of a Python start-up on the node.

    ``watch_accounts`` (an agent sudo started): a launch is answered ``{"recheck": FP}``
    instead, launching nothing, when what decides sudo's answer may have changed since sudo
    was last asked (:mod:`.accounts`); the scheduler asks sudo, then sends the launch again
    with ``--accounts-checked FP``.
    """
    from .accounts import AccountWatch

    parser = _parser()
    watch = AccountWatch() if watch_accounts else None
    while line := sys.stdin.buffer.readline():
        try:
            request = json.loads(line)
            try:
                args = parser.parse_args([str(a) for a in request["args"]])
            except SystemExit:  # argparse said why on stderr; the agent must go on serving
                raise AgentError(f"malformed request {request['args']!r}") from None
            if args.cmd not in SERVED or args.setenv:
                raise AgentError(f"a serving agent answers only {', '.join(SERVED)}")
            recheck = None
            if watch is not None and args.cmd == "launch":
                recheck = watch.may_launch(args.accounts_checked)
            if recheck is not None:
                why = "the node's accounts or sudoers changed: ask sudo again before launching"
                result, code = {"error": why, "recheck": recheck}, 1
            else:
                result, code = _command(args, umask, io.StringIO(request.get("input") or "")), 0
        except (AgentError, OSError, ValueError, KeyError, TypeError) as exc:
            result, code = {"error": str(exc)}, 1
        sys.stdout.write(json.dumps({"exit": code, "answer": result}) + "\n")
        sys.stdout.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; print its JSON answer (or raw bytes for ``log``)."""
    args = _parser().parse_args(argv)
    try:
        umask = _as_started(args.setenv)
        if args.cmd == "serve":
            return serve(umask, watch_accounts=args.watch_accounts)
        if args.cmd == "log":
            log(
                args.file,
                args.offset,
                args.limit,
                follow=args.follow,
                job_dir=args.job_dir,
                pid=args.pid,
                start_time=args.start_time,
            )
            return 0
        result = _command(args, umask, sys.stdin)
    except (AgentError, OSError, ValueError) as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
