"""The node agent: ``python -m jupyter_gpusched.node.agent probe|launch|status|kill|log``.

Runs on each GPU node over SSH, so it imports only the standard library (plus pynvml when the
node has it) and may run under the node's system Python. Every subcommand prints one JSON
object on stdout; errors print ``{"error": ...}`` and exit 1. ``log`` is the exception: it
writes raw log bytes.

A job runs under a small wrapper that is its own session leader (it survives the SSH channel
and the scheduler), starts the job in a process group of its own (so cancelling the job never
signals the wrapper) and records ``exit_code`` and ``ended_at`` in the job dir by atomic
rename. ``exit_code`` is ``-N`` when the job died of signal ``N``, as in :mod:`subprocess`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from datetime import UTC
from typing import Any

from .probe import AgentError, probe

# subprocess, socket, csv, select and datetime are imported by the subcommands that use them:
# every poll starts this module on the node, so its start-up time is paid on each call.

#: Where a job reports its checkpoints: it writes the Unix time of each finished checkpoint
#: there (``jupyter_gpusched.checkpointed()``, or ``date +%s > "$GPUSCHED_CHECKPOINT_FILE"``),
#: so stopping it (preemption, a move) is charged only the work since then.
CHECKPOINT_ENV = "GPUSCHED_CHECKPOINT_FILE"


# --------------------------------------------------------------------------- probe


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, pgrp, start time in clock ticks) from /proc/PID/stat, None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2 :].split()
    # after "pid (comm) ": field 3 is index 0, so field 5 -> [2], field 22 -> [19]
    return fields[0], int(fields[2]), int(fields[19])


def _write_atomic(path: str, text: str, *, durable: bool = True) -> None:
    """Write by rename so readers never see half a file; ``durable`` also survives a crash."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def _now_iso() -> str:
    from datetime import datetime

    return datetime.now(UTC).isoformat()


def _wrap(job_dir: str, argv: list[str], report_fd: int, answer: dict[str, Any]) -> int:
    """Body of the wrapper process: run the job, record its launch, record how it ended.

    The wrapper writes the launch record itself, right after starting the job: it is already
    detached (its own session), so an agent killed mid-launch (its SSH channel closed) cannot
    leave a job running without a record.
    """
    child = 0

    def forward(signum: int, _frame: Any) -> None:
        if child:
            try:
                os.killpg(child, signum)
            except ProcessLookupError:
                pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    stat = _stat(os.getpid())
    answer = {**answer, "pid": os.getpid(), "start_time": stat[2] if stat else None}
    try:
        # posix_spawn, not subprocess: it is on the submit -> start path and needs no import.
        # The job gets a process group of its own: cancelling it must not hit the wrapper.
        child = os.posix_spawnp(argv[0], argv, os.environ, setpgroup=0)
    except OSError as exc:
        print(f"gpusched: cannot start {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        _launched(job_dir, {**answer, "pgid": os.getpid()}, report_fd)
        _write_atomic(os.path.join(job_dir, "ended_at"), _now_iso())
        _write_atomic(os.path.join(job_dir, "exit_code"), "127")
        return 127
    _launched(job_dir, {**answer, "pgid": child}, report_fd)
    _, status = os.waitpid(child, 0)  # retried on EINTR (PEP 475) while forwarding signals
    code = os.waitstatus_to_exitcode(status)  # -N when killed by signal N
    _write_atomic(os.path.join(job_dir, "ended_at"), _now_iso())
    _write_atomic(os.path.join(job_dir, "exit_code"), str(code))
    return 0


def _launched(job_dir: str, answer: dict[str, Any], report_fd: int) -> None:
    """Record the launch (the record a repeated launch returns), then tell the agent."""
    text = json.dumps(answer)
    # not fsynced: it sits on the submit path (~10 ms per fsync here) and only matters for a
    # repeated launch, which a node crash makes moot anyway
    _write_atomic(os.path.join(job_dir, "launch.json"), text, durable=False)
    try:
        os.write(report_fd, text.encode())
        os.close(report_fd)
    except OSError:
        pass  # the agent is gone; the record tells the next one


def launch(
    job_dir: str,
    argv: list[str],
    *,
    cwd: str | None = None,
    env: Sequence[str] = (),
    gpus: str | None = None,
    log: str | None = None,
) -> dict[str, Any]:
    """Start ``argv`` detached under the wrapper; return its pid, pgid, start time and log."""
    if not argv:
        raise AgentError("launch needs a command after --")
    job_dir = os.path.abspath(os.path.expanduser(job_dir))
    os.makedirs(job_dir, mode=0o700, exist_ok=True)
    log_path = os.path.abspath(os.path.expanduser(log or os.path.join(job_dir, "output.log")))
    run_dir = os.path.expanduser(cwd) if cwd else job_dir
    if not os.path.isdir(run_dir):
        raise AgentError(f"working directory {run_dir} does not exist on this node")
    child_env = dict(os.environ)
    # a detached kernel that sees JPY_PARENT_PID shuts itself down when that pid is gone
    child_env.pop("JPY_PARENT_PID", None)
    for item in env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise AgentError(f"--env {item!r} is not KEY=VALUE")
        child_env[key] = value
    if gpus is not None:
        child_env["CUDA_VISIBLE_DEVICES"] = gpus
    child_env[CHECKPOINT_ENV] = os.path.join(job_dir, "checkpoint")
    record = os.path.join(job_dir, "launch.json")
    lock = os.path.join(job_dir, "launch.lock")
    if os.path.exists(lock):
        return _reused(job_dir)
    answer = {"job_dir": job_dir, "log": log_path}
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the wrapper
        try:
            os.close(read_fd)
            # Detach first: from here on nothing that stops the agent (a closed SSH channel
            # signals its process group) stops this launch half way.
            os.setsid()
            try:
                # Launch is idempotent per job dir: whoever takes the lock starts the job.
                os.close(os.open(lock, os.O_CREAT | os.O_EXCL, 0o600))
            except FileExistsError:
                os.write(write_fd, b'{"taken": true}')
                os._exit(0)
            log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            os.chdir(run_dir)
            os.environ.clear()
            os.environ.update(child_env)
            os._exit(_wrap(job_dir, argv, write_fd, answer))
        except BaseException:  # noqa: BLE001 - a forked child must never return into the caller
            os._exit(126)
    os.close(write_fd)
    report = b""
    while chunk := os.read(read_fd, 4096):
        report += chunk
    os.close(read_fd)
    if not report:
        if os.path.exists(record):
            return _reused(job_dir)
        raise AgentError("the job wrapper died before starting the job")
    started = json.loads(report)
    if started.get("taken"):
        os.waitpid(pid, 0)  # it found the lock taken and exited: reap it
        return _reused(job_dir)
    return {**started, "reused": False}


def _reused(job_dir: str) -> dict[str, Any]:
    """The first launch of a job dir (repeating a launch returns it, never starts twice)."""
    record = os.path.join(job_dir, "launch.json")
    # The wrapper writes the record right after taking the lock (it is detached, so it gets
    # there even if the agent that forked it is gone): wait a little for it.
    deadline = time.monotonic() + 10.0
    while not os.path.exists(record) and time.monotonic() < deadline:
        time.sleep(0.02)
    previous = _read(record)
    if previous is None:
        raise AgentError(f"{job_dir} holds a launch that never finished starting")
    return {**json.loads(previous), "reused": True}


def claim(job_dir: str) -> dict[str, Any]:
    """The launch of a job dir if it started; else make sure none ever starts there.

    For a scheduler that finds a job cancelled (or its lease lost) while its launch may be
    in flight elsewhere: taking the lock first means a late launch of this job dir finds it
    taken and starts nothing. ``started`` is True (with the record), False (claimed, never
    started) or None (a launch died half way; its process, if any, has no record).
    """
    job_dir = os.path.abspath(os.path.expanduser(job_dir))
    os.makedirs(job_dir, mode=0o700, exist_ok=True)
    try:
        os.close(os.open(os.path.join(job_dir, "launch.lock"), os.O_CREAT | os.O_EXCL, 0o600))
        return {"started": False}
    except FileExistsError:
        pass
    try:
        previous = _reused(job_dir)
    except AgentError:
        return {"started": None}
    previous.pop("reused")
    return {"started": True, **previous}


# --------------------------------------------------------------------------- status / kill


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def is_running(pid: int, start_time: int | None) -> bool:
    """Alive, not a zombie, and not a recycled pid (start time must match)."""
    stat = _stat(pid)
    if stat is None or stat[0] in ("Z", "X"):
        return False
    return start_time is None or stat[2] == start_time


def status(job_dir: str, pid: int, start_time: int | None) -> dict[str, Any]:
    """Running, or ended with the wrapper's recorded exit code (null when nothing recorded)."""
    job_dir = os.path.expanduser(job_dir)
    code = _read(os.path.join(job_dir, "exit_code"))
    if code is not None:
        return {
            "running": False,
            "exit_code": int(code),
            "ended_at": _read(os.path.join(job_dir, "ended_at")),
        }
    if is_running(pid, start_time):
        return {"running": True, "exit_code": None, "ended_at": None}
    # the wrapper may have written the files between our two looks
    code = _read(os.path.join(job_dir, "exit_code"))
    return {
        "running": False,
        "exit_code": int(code) if code is not None else None,
        "ended_at": _read(os.path.join(job_dir, "ended_at")),
    }


def _group_alive(pgid: int) -> bool:
    """Any non-zombie process left in the group (``kill -0`` counts zombies, PID 1 leaves them)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[1] == pgid and stat[0] not in ("Z", "X"):
                return True
    return False


def kill(pgid: int, grace_s: float, job_dir: str | None = None) -> dict[str, Any]:
    """TERM the process group, KILL it after ``grace_s``; wait for the wrapper's record."""
    if pgid <= 1:
        raise AgentError(f"refusing to signal process group {pgid}")
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return {"terminated": False, "killed": False}
    deadline = time.monotonic() + grace_s
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    killed = False
    if _group_alive(pgid):
        try:
            os.killpg(pgid, signal.SIGKILL)
            killed = True
        except ProcessLookupError:
            pass
    if job_dir:
        record = os.path.join(os.path.expanduser(job_dir), "exit_code")
        until = time.monotonic() + 5.0
        while not os.path.exists(record) and time.monotonic() < until:
            time.sleep(0.02)
    return {"terminated": True, "killed": killed}


# --------------------------------------------------------------------------- log


def _copy_from(path: str, offset: int, limit: int | None, out: Any) -> int:
    """Write bytes of ``path`` from ``offset`` (at most ``limit``); return the new offset."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read() if limit is None else f.read(limit)
    except FileNotFoundError:
        return offset
    if data:
        out.write(data)
        out.flush()
    return offset + len(data)


def log(
    path: str,
    offset: int,
    limit: int | None,
    *,
    follow: bool = False,
    job_dir: str | None = None,
    pid: int | None = None,
    start_time: int | None = None,
) -> None:
    """Write log bytes; with ``follow`` keep writing new ones until the job ends.

    A follower stops when its stdin reaches EOF: closing the SSH channel does not kill the
    remote command under OpenSSH, but it does close the command's stdin.
    """
    import select

    path = os.path.expanduser(path)
    out = sys.stdout.buffer
    offset = _copy_from(path, offset, None if follow else limit, out)
    if not follow:
        return

    def ended() -> bool:
        if job_dir and os.path.exists(os.path.join(os.path.expanduser(job_dir), "exit_code")):
            return True
        return pid is not None and not is_running(pid, start_time)

    while True:
        done = ended()
        offset = _copy_from(path, offset, None, out)
        if done:
            return
        readable, _, _ = select.select([sys.stdin], [], [], 0.2)
        if readable and not os.read(sys.stdin.fileno(), 4096):
            return


# --------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jupyter_gpusched.node.agent")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("probe", help="report this node's GPUs as JSON")
    lp = sub.add_parser("launch", help="start a job detached")
    lp.add_argument("--job-dir", required=True)
    lp.add_argument("--cwd")
    lp.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    lp.add_argument("--gpus", help="comma-separated GPU UUIDs or indices for CUDA_VISIBLE_DEVICES")
    lp.add_argument("--log")
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
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; print its JSON answer (or raw bytes for ``log``)."""
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "probe":
            result: dict[str, Any] = probe()
        elif args.cmd == "claim":
            result = claim(args.job_dir)
        elif args.cmd == "launch":
            command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            result = launch(
                args.job_dir, command, cwd=args.cwd, env=args.env, gpus=args.gpus, log=args.log
            )
        elif args.cmd == "status":
            result = status(args.job_dir, args.pid, args.start_time)
        elif args.cmd == "kill":
            result = kill(args.pgid, args.grace, args.job_dir)
        else:
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
    except (AgentError, OSError, ValueError) as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
