"""A job's life on its node: the wrapper, launch, claims, status, kill and logs.

Run by the node agent (:mod:`.agent`), as the job's owner, under the node's system Python:
the standard library only.
A job runs under a small wrapper in a session of its own (it survives the SSH channel
and the scheduler), starts the job in a process group of its own (so cancelling the job never
signals the wrapper) and records ``exit_code`` and ``ended_at`` in the job dir by atomic
rename. ``exit_code`` is ``-N`` when the job died of signal ``N``, as in :mod:`subprocess`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from datetime import UTC
from typing import Any

from .probe import AgentError
from .stage import private_dir

# subprocess, socket, select and datetime are imported by the functions that use them: every
# poll starts the agent on the node (unless one is serving), so start-up time is paid per call.

#: Where a job reports its checkpoints: it writes the Unix time of each finished checkpoint
#: there (``jupyter_gpusched.checkpointed()``, or ``date +%s > "$GPUSCHED_CHECKPOINT_FILE"``),
#: so stopping it (preemption, a move) is charged only the work since then.
CHECKPOINT_ENV = "GPUSCHED_CHECKPOINT_FILE"
#: Where a job with parameters (a notebook's) finds them: a JSON object in a 0600 file of its
#: private job dir. Never on a command line, which every user of the node reads with ``ps``.
PARAMETERS_ENV = "GPUSCHED_PARAMETERS_FILE"
#: That file's name in the job dir.
PARAMETERS_FILE = "parameters.json"


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
    """Write by rename so readers never see half a file (0600); ``durable`` survives a crash."""
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def _now_iso() -> str:
    from datetime import datetime

    return datetime.now(UTC).isoformat()


def _wrap(
    job_dir: str, argv: list[str], env: dict[str, str], report_fd: int, log_path: str, umask: int
) -> int:
    """Body of the wrapper process: run the job, record and report it, record how it ended."""
    child = 0

    def started(pgid: int) -> None:
        # The wrapper, not the agent, writes the launch record: the agent dies with its SSH
        # channel (a scheduler killed mid-launch), the wrapper lives in a session of its own.
        stat = _stat(os.getpid())
        record = {
            "pid": os.getpid(),
            "pgid": pgid,
            "start_time": stat[2] if stat else None,
            "job_dir": job_dir,
            "log": log_path,
        }
        # not fsynced: it sits on the submit path (~10 ms per fsync here) and only matters for
        # a repeated launch, which a node crash makes moot anyway
        _write_atomic(os.path.join(job_dir, "launch.json"), json.dumps(record), durable=False)
        try:
            os.write(report_fd, json.dumps(record).encode())
        except OSError:
            pass  # the agent died with its channel: the record above tells the next look
        finally:
            os.close(report_fd)

    def forward(signum: int, _frame: Any) -> None:
        if child:
            try:
                os.killpg(child, signum)
            except ProcessLookupError:
                pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    try:
        # posix_spawn, not subprocess: it is on the submit -> start path and needs no import.
        # The job gets a process group of its own: cancelling it must not hit the wrapper.
        private = os.umask(umask)  # the job creates files as its user would
        try:
            child = os.posix_spawnp(argv[0], argv, env, setpgroup=0)
        finally:
            os.umask(private)
    except OSError as exc:
        print(f"gpusched: cannot start {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        _write_atomic(os.path.join(job_dir, "ended_at"), _now_iso())
        _write_atomic(os.path.join(job_dir, "exit_code"), "127")
        started(os.getpid())
        return 127
    started(child)
    _, status = os.waitpid(child, 0)  # retried on EINTR (PEP 475) while forwarding signals
    code = os.waitstatus_to_exitcode(status)  # -N when killed by signal N
    _write_atomic(os.path.join(job_dir, "ended_at"), _now_iso())
    _write_atomic(os.path.join(job_dir, "exit_code"), str(code))
    return 0


def launch(
    job_dir: str,
    argv: list[str],
    *,
    cwd: str | None = None,
    env: Sequence[str] = (),
    gpus: str | None = None,
    log: str | None = None,
    umask: int = 0o022,
    parameters: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Start ``argv`` detached under the wrapper; return its pid, pgid, start time and log.

    ``umask`` is the job's (the agent's own files are private whatever it is).
    ``parameters`` are written to :data:`PARAMETERS_FILE` in the job dir (0600), named by
    ``$GPUSCHED_PARAMETERS_FILE``: values a user keeps secret never reach a command line.
    """
    if not argv:
        raise AgentError("launch needs a command after --")
    job_dir = private_dir(job_dir)
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
    if parameters is not None:
        path = os.path.join(job_dir, PARAMETERS_FILE)
        _write_atomic(path, json.dumps(parameters), durable=False)
        child_env[PARAMETERS_ENV] = path
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the wrapper
        try:
            os.close(read_fd)
            os.setsid()
            # Forked twice, so init, not this agent, is the wrapper's parent: a serving agent
            # (see serve) outlives many jobs and would otherwise collect their zombies.
            if os.fork():
                os._exit(0)
            # The attempt's lock is taken only here, in a session of its own that outlives
            # this agent and its SSH channel: a lock never exists without a process that goes
            # on to start the job and write the launch record.
            try:
                lock = os.path.join(job_dir, "launch.lock")
                os.close(os.open(lock, os.O_CREAT | os.O_EXCL, 0o600))
            except FileExistsError:
                os.write(write_fd, b'{"exists": true}')
                os._exit(0)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            os.chdir(run_dir)
            # posix_spawnp searches this process's PATH, not the env it passes: the job's
            if child_env.get("PATH") != os.environ.get("PATH"):
                os.environ["PATH"] = child_env.get("PATH", os.defpath)
            os._exit(_wrap(job_dir, argv, child_env, write_fd, log_path, umask))
        except BaseException:  # noqa: BLE001 - a forked child must never return into the caller
            os._exit(126)
    os.close(write_fd)
    os.close(log_fd)
    os.waitpid(pid, 0)  # the first fork, which exits at once
    report = b""
    while chunk := os.read(read_fd, 4096):
        report += chunk
    os.close(read_fd)
    if not report:
        raise AgentError("the job wrapper died before starting the job")
    answer = json.loads(report)
    if not answer.get("exists"):
        return {**answer, "reused": False}
    # Launch is idempotent per job dir: a scheduler that crashed after starting the job but
    # before storing its pid gets the same job back instead of a second copy.
    record = os.path.join(job_dir, "launch.json")
    deadline = time.monotonic() + 10.0
    while not os.path.exists(record) and time.monotonic() < deadline:
        time.sleep(0.02)
    previous = _read(record)
    if previous is None:
        raise AgentError(f"{job_dir} holds a launch that never finished starting")
    return {**json.loads(previous), "reused": True}


def claim(job_dir: str, *, wait_s: float = 10.0) -> dict[str, Any]:
    """The launch of a job dir if it started; else make sure none ever starts there.

    For a scheduler that finds a job cancelled (or its lease lost) while its launch may be
    in flight elsewhere: taking the lock first means a late launch of this job dir finds it
    taken and starts nothing. ``started`` is True (with the record), False (claimed, never
    started) or None (a launch died half way; its process, if any, has no record).
    """
    job_dir = private_dir(job_dir)
    record = os.path.join(job_dir, "launch.json")
    try:
        os.close(os.open(os.path.join(job_dir, "launch.lock"), os.O_CREAT | os.O_EXCL, 0o600))
        return {"started": False}
    except FileExistsError:
        deadline = time.monotonic() + wait_s
        while not os.path.exists(record) and time.monotonic() < deadline:
            time.sleep(0.02)
    previous = _read(record)
    return {"started": None} if previous is None else {"started": True, **json.loads(previous)}


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
        checkpoint = _read(os.path.join(job_dir, "checkpoint"))
        return {"running": True, "exit_code": None, "ended_at": None, "checkpoint": checkpoint}
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
    """Write bytes of ``path`` from ``offset`` (at most ``limit``); return the new offset.

    A negative ``offset`` counts from the end (the last bytes: a failed job's last error).
    """
    try:
        with open(path, "rb") as f:
            if offset < 0:
                offset = max(0, f.seek(0, os.SEEK_END) + offset)
            f.seek(offset)
            data = f.read() if limit is None else f.read(limit)
    except FileNotFoundError:
        return max(0, offset)
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
    remote command under OpenSSH, but it does close the command's stdin. It also stops when
    its parent (the SSH session, ``sudo``) goes without closing that stdin: a quiet job's
    follower would otherwise never write, so never meet the closed pipe that ends it.
    """
    import select

    parent = os.getppid()
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
        if os.getppid() != parent or parent == 1:  # orphaned: adopted by init or a subreaper
            return
