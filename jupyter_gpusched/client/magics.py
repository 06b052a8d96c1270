"""``%gpu`` / ``%%gpu``: run cells on a leased GPU, queue scripts, look at the cluster.

Loaded with ``%load_ext jupyter_gpusched``. Runs in the user's local kernel and speaks only the
REST API of the Jupyter server that started the kernel (found through ``$GPUSCHED_URL`` /
``$GPUSCHED_TOKEN``, which the server extension exports to its kernels, else the running-server
files of the runtime dir, preferring the kernel's parent server).

A ``%%gpu`` cell acquires (or reuses) a lease — one per notebook by default, more with
``--lease NAME`` — and runs in the lease's remote ipykernel through a jupyter_client
:class:`~jupyter_client.BlockingKernelClient` on the ports the server forwards to its loopback.
Outputs are relayed as they arrive; remote errors fail the cell with the remote traceback only;
Ctrl-C interrupts the remote cell. Activity is reported to the server in the background at most
every ``touch_interval_s``, so a warm cell costs no REST round trip.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import shlex
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import display

from jupyter_gpusched.cli.jobs import duration_arg, size_arg
from jupyter_gpusched.core.errors import GpuSchedError

from .api import ApiError, GpuSchedClient, ServerInfo, find_server
from .remote import StopWaiting, beating, run_remote

TERMINAL = ("succeeded", "failed", "cancelled")


class GpuMagicError(Exception):
    """A ``%gpu`` failure shown as one line (bad argument, refused request), no traceback."""

    def _render_traceback_(self) -> list[str]:
        return [f"%gpu: {self}"]


class _LeaseGone(Exception):
    """The lease ended under a cell; ``started`` says whether the kernel had begun it."""

    def __init__(self, started: bool, why: str) -> None:
        super().__init__(why)
        self.started = started
        self.why = why


# ---------------------------------------------------------------------------- arguments


class _HelpShown(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors as one :class:`GpuMagicError` line instead of exiting."""

    def __init__(self, prog: str, **kw: Any) -> None:
        super().__init__(prog=prog, allow_abbrev=False, **kw)

    def error(self, message: str) -> Any:  # noqa: D102
        raise GpuMagicError(f"{message} (see {self.prog} --help)")

    def exit(self, status: int = 0, message: str | None = None) -> Any:  # noqa: D102
        if message:
            print(message, end="")
        raise _HelpShown


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _resources(p: _Parser) -> None:
    p.add_argument("--gpus", type=_positive_int, default=1, help="GPUs, on one node (default 1)")
    p.add_argument("--mem", type=size_arg, help="GPU memory needed on each GPU, e.g. 16G")
    p.add_argument("--share", type=float, help="share of one GPU (0-1], e.g. 0.5")
    p.add_argument("--model", action="append", default=[], help="allowed GPU model, e.g. A100")
    p.add_argument("--max-runtime", type=duration_arg, help="stop after this long, e.g. 2h")


def _cell_parser() -> _Parser:
    p = _Parser("%%gpu", description="Run this cell on a leased GPU (variables persist).")
    _resources(p)
    p.add_argument("--lease", default="default", help="lease name; one kernel per name")
    p.add_argument("--timeout", type=duration_arg, help="give up waiting for the lease after this")
    return p


_CELL_PARSER = _cell_parser()


def _spec(args: argparse.Namespace) -> dict[str, Any]:
    spec: dict[str, Any] = {"gpus": args.gpus}
    if args.mem is not None:
        spec["gpu_mem_gb"] = args.mem
    if args.share is not None:
        spec["gpu_share"] = args.share
    if args.model:
        spec["gpu_models"] = list(args.model)
    if args.max_runtime is not None:
        spec["max_runtime_s"] = args.max_runtime
    return spec


# ---------------------------------------------------------------------------- finding the server


def discover(runtime_dir: str | None = None, parent_pids: set[int] | None = None) -> ServerInfo:
    """The server this kernel belongs to.

    ``$GPUSCHED_URL`` first (the extension exports it); else the running-server file of the
    kernel's parent server (``JPY_PARENT_PID`` or the parent process); else any server that
    answers our API (:func:`~jupyter_gpusched.client.api.find_server`).
    """
    if os.environ.get("GPUSCHED_URL"):
        return find_server()
    from jupyter_server.serverapp import list_running_servers

    if parent_pids is None:
        parent_pids = {os.getppid()}
        with contextlib.suppress(ValueError):
            parent_pids.add(int(os.environ.get("JPY_PARENT_PID", "")))
    for info in list_running_servers(runtime_dir):
        if info.get("pid") in parent_pids:
            return ServerInfo(str(info["url"]), str(info.get("token", "")))
    return find_server(runtime_dir=runtime_dir)


# ---------------------------------------------------------------------------- leases


@dataclass
class _Lease:
    """A lease this kernel uses, and the client connected to its remote kernel."""

    name: str
    job_id: int
    job: dict[str, Any]
    kc: Any = None
    generation: int = 0
    connection: dict[str, Any] = field(default_factory=dict)
    touched_at: float = 0.0
    stale: bool = False  # the server forwarded again: reconnect before the next cell
    lock: threading.Lock = field(default_factory=threading.Lock)


def _session_name() -> str:
    """The notebook's name for its leases (the kernel's id when the notebook is unknown)."""
    name = os.environ.get("JPY_SESSION_NAME", "")
    if name:
        return name[-150:]
    with contextlib.suppress(Exception):
        from ipykernel.kernelapp import IPKernelApp

        if IPKernelApp.initialized():
            conn = os.path.basename(IPKernelApp.instance().connection_file)
            return conn.removesuffix(".json")[-150:]
    return f"pid-{os.getpid()}"


@magics_class
class GpuMagics(Magics):
    """``%gpu`` (line: subcommands) and ``%%gpu`` (cell: run remotely)."""

    touch_interval_s = 30.0

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self._client: GpuSchedClient | None = None
        self._leases: dict[str, _Lease] = {}
        self._session = _session_name()
        atexit.register(self.release_all)

    # -- the server ---------------------------------------------------------------------------

    @property
    def client(self) -> GpuSchedClient:
        """The REST client, found on first use."""
        if self._client is None:
            try:
                info = discover()
            except GpuSchedError as exc:
                raise GpuMagicError(exc.message) from None
            self._client = GpuSchedClient(info.url, info.token)
        return self._client

    def _call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except GpuSchedError as exc:
            raise GpuMagicError(exc.message) from None

    # -- entry point --------------------------------------------------------------------------

    @line_cell_magic
    def gpu(self, line: str, cell: str | None = None) -> Any:
        """``%%gpu [--gpus N] [--mem 16G] [--lease NAME]``: run the cell on a GPU.

        ``%gpu release|status|queue|submit|cancel|logs|leases|config``: see ``%gpu --help``.
        """
        try:
            argv = shlex.split(line)
        except ValueError as exc:
            raise GpuMagicError(f"cannot read the arguments: {exc}") from None
        try:
            if cell is not None:
                args = _CELL_PARSER.parse_args(argv)
                return self.run_cell(cell, args)
            return self._line(argv)
        except _HelpShown:
            return None

    def _line(self, argv: list[str]) -> Any:
        commands = {
            "release": self._release_cmd,
            "status": self._status_cmd,
            "queue": self._queue_cmd,
            "submit": self._submit_cmd,
            "submit-notebook": self._submit_notebook_cmd,
            "cancel": self._cancel_cmd,
            "logs": self._logs_cmd,
            "leases": self._leases_cmd,
            "config": self._config_cmd,
        }
        if not argv or argv[0] in ("-h", "--help", "help"):
            print(
                "usage: %gpu {" + ",".join(commands) + "} ...   (%%gpu runs a cell on a GPU; "
                "%gpu COMMAND --help for details)"
            )
            return None
        command = commands.get(argv[0])
        if command is None:
            raise GpuMagicError(f"unknown command {argv[0]!r}; use one of {', '.join(commands)}")
        return command(argv[1:])

    # -- %%gpu --------------------------------------------------------------------------------

    def run_cell(self, code: str, args: argparse.Namespace) -> Any:
        """Run ``code`` in the lease's remote kernel, relaying its outputs into this cell."""
        lease = self._lease(args)
        with lease.lock:
            self._touch_soon(lease)
            try:
                return self._execute(lease, code)
            except _LeaseGone as gone:
                if gone.started:
                    raise GpuMagicError(
                        f"lease {lease.job_id} ended while the cell ran: {gone.why}"
                    ) from None
                # the cell never reached the kernel: run it on a new lease
                print(f"%gpu: lease {lease.job_id} ended ({gone.why}); requesting a new one")
        lease = self._lease(args)
        with lease.lock:
            return self._execute(lease, code)

    def _lease_name(self, name: str) -> str:
        return f"{self._session}:{name}"

    def _lease(self, args: argparse.Namespace) -> _Lease:
        """A lease with a connected kernel client: the cached one, adopted, or a new one."""
        name = self._lease_name(args.lease)
        lease = self._leases.get(name)
        if lease is not None and lease.kc is not None and not lease.stale:
            if beating(lease.kc):
                return lease
        if lease is not None and self._refresh(lease) == "ended":
            self._forget(lease)
            why = lease.job.get("reason") or lease.job["state"]
            print(f"%gpu: lease {lease.job_id} ended ({why}); requesting a new one")
            lease = None
        if lease is None:
            lease = self._adopt(name) or self._request(name, args)
            self._leases[name] = lease
        while lease.kc is None or lease.stale:  # new, or requeued after its node was lost
            self._wait_running(lease, args.timeout)
            state = self._refresh(lease)
            if state == "ended":
                self._forget(lease)
                raise GpuMagicError(
                    f"lease {lease.job_id} {lease.job['state']}: {lease.job.get('reason')}"
                )
            if state == "waiting":
                time.sleep(0.2)
        return lease

    def _adopt(self, name: str) -> _Lease | None:
        for job in self._call(self.client.leases):
            if job["spec"].get("lease_name") == name and job["state"] not in TERMINAL:
                return _Lease(name, int(job["id"]), job)
        return None

    def _request(self, name: str, args: argparse.Namespace) -> _Lease:
        spec = {
            "kind": "lease",
            "lease_name": name,
            "name": f"%%gpu {args.lease}",
            "env": {"GPUSCHED_KERNEL_CWD": os.getcwd()},
            **_spec(args),
        }
        job = self._call(self.client.submit, spec)
        return _Lease(name, int(job["id"]), job)

    def _refresh(self, lease: _Lease) -> str:
        """Ask the server about the lease (marks activity): ``ok``, ``waiting`` or ``ended``.

        Reconnects the kernel client when the server forwarded the ports again.
        """
        try:
            answer = self.client.call("GET", f"leases/{lease.job_id}/kernel")
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise GpuMagicError(exc.message) from None
            if exc.status == 404:
                lease.job = {**lease.job, "state": "cancelled", "reason": exc.message}
                return "ended"
            lease.job = self._call(self.client.get_job, lease.job_id)
            if lease.job["state"] in TERMINAL:
                return "ended"
            lease.stale = True  # a new kernel will start: connect again once it runs
            return "waiting"
        except GpuSchedError as exc:
            raise GpuMagicError(exc.message) from None
        lease.job = answer["lease"]
        lease.touched_at = time.monotonic()
        if lease.kc is None or lease.stale or _moved(lease, answer):
            self._open_client(lease, answer)
        return "ok"

    def _forget(self, lease: _Lease) -> None:
        self._leases.pop(lease.name, None)
        if lease.kc is not None:
            with contextlib.suppress(Exception):
                lease.kc.stop_channels()
            lease.kc = None

    def _wait_running(self, lease: _Lease, timeout_s: float | None) -> None:
        """Wait with one updating line saying why; Ctrl-C or timeout gives the lease back."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        handle = None
        shown = ""
        window: dict[str, Any] = {}
        window_at = float("-inf")
        try:
            while True:
                job = lease.job
                if job["state"] == "running":
                    break
                if job["state"] in TERMINAL:
                    self._leases.pop(lease.name, None)
                    raise GpuMagicError(
                        f"lease {lease.job_id} {job['state']}: {job.get('reason') or 'no reason'}"
                    )
                if time.monotonic() - window_at > 10:
                    with contextlib.suppress(GpuSchedError):
                        window = self.client.cluster().get("window") or {}
                    window_at = time.monotonic()
                text = _waiting_line(job, window)
                if text != shown:
                    if handle is None:
                        handle = display({"text/plain": text}, raw=True, display_id=True)
                    else:
                        handle.update({"text/plain": text}, raw=True)
                    shown = text
                if deadline is not None and time.monotonic() > deadline:
                    self._give_back(lease)
                    raise GpuMagicError(f"lease {lease.job_id} did not start in time; cancelled")
                time.sleep(0.2)
                lease.job = self._call(self.client.get_job, lease.job_id)
        except KeyboardInterrupt:
            self._give_back(lease)
            raise GpuMagicError(f"interrupted; lease {lease.job_id} was cancelled") from None
        if handle is not None:
            handle.update({"text/plain": _running_line(lease.job)}, raw=True)

    def _give_back(self, lease: _Lease) -> None:
        self._forget(lease)
        with contextlib.suppress(GpuSchedError):
            self.client.release(lease.job_id)

    def _open_client(self, lease: _Lease, answer: dict[str, Any]) -> None:
        from jupyter_client import BlockingKernelClient

        if lease.kc is not None:
            with contextlib.suppress(Exception):
                lease.kc.stop_channels()
        kc = BlockingKernelClient()
        kc.load_connection_info(answer["connection"])
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=60)
        except RuntimeError as exc:
            kc.stop_channels()
            raise GpuMagicError(
                f"the kernel of lease {lease.job_id} does not answer: {exc}"
            ) from None
        lease.kc = kc
        lease.generation = int(answer["generation"])
        lease.connection = dict(answer["connection"])
        lease.stale = False

    def _touch_soon(self, lease: _Lease) -> None:
        """Report activity in the background, at most every ``touch_interval_s``."""
        if time.monotonic() - lease.touched_at < self.touch_interval_s:
            return
        lease.touched_at = time.monotonic()
        client = self.client

        def touch() -> None:
            try:
                answer = client.call("GET", f"leases/{lease.job_id}/kernel")
            except GpuSchedError:
                return  # the next cell finds out what happened
            if _moved(lease, answer):
                lease.stale = True

        threading.Thread(target=touch, name="gpusched-touch", daemon=True).start()

    # -- running one cell ---------------------------------------------------------------------

    def _execute(self, lease: _Lease, code: str) -> Any:
        kernel = getattr(self.shell, "kernel", None)
        try:
            return run_remote(
                lease.kc,
                code,
                allow_stdin=bool(getattr(kernel, "_allow_stdin", False)),
                tick=lambda: self._touch_soon(lease),  # a long cell is activity too
                silent=lambda started: self._lost_while_running(lease, started),
            )
        except StopWaiting:
            raise GpuMagicError(
                f"stopped waiting; the cell may still run on lease {lease.job_id} "
                "(%gpu release ends it)"
            ) from None

    def _lost_while_running(self, lease: _Lease, started: bool) -> None:
        """The kernel stopped answering: did the lease end or the forwards drop."""
        job = self._call(self.client.get_job, lease.job_id)
        lease.job = job
        if job["state"] in TERMINAL:
            self._forget(lease)
            raise _LeaseGone(started, job.get("reason") or job["state"])
        try:
            answer = self.client.call("GET", f"leases/{lease.job_id}/kernel")
        except GpuSchedError:
            return  # node unreachable for now: keep waiting
        if answer.get("connection") != lease.connection:  # new ports: this client is lost
            lease.stale = True
            raise GpuMagicError(
                f"lost the kernel of lease {lease.job_id} while the cell ran (the server "
                "restarted?); the next cell reconnects"
            )
        if answer.get("generation") != lease.generation:
            lease.stale = True  # same ports, forwarded again: ZMQ reconnects by itself

    # -- line commands ------------------------------------------------------------------------

    def release_all(self) -> None:
        """Give back every lease of this kernel (kernel shutdown; a gone server is no wait)."""
        if self._client is not None:
            self._client = GpuSchedClient(self._client.url, self._client.token, timeout_s=3.0)
        for lease in list(self._leases.values()):
            self._give_back(lease)

    def _release_cmd(self, argv: list[str]) -> None:
        p = _Parser("%gpu release", description="Release a lease and free its GPUs.")
        p.add_argument("--lease", default="default", help="lease name (default: default)")
        p.add_argument("--all", action="store_true", help="every lease of this notebook")
        args = p.parse_args(argv)
        names = list(self._leases) if args.all else [self._lease_name(args.lease)]
        released = []
        for name in names:
            lease = self._leases.get(name) or self._adopt(name)
            if lease is None:
                continue
            # no shutdown_request first: the kernel could exit 0 before the release arrives
            # and the lease would end as "succeeded"; the release TERMs its process group
            self._forget(lease)
            try:
                self.client.release(lease.job_id)
            except ApiError as exc:
                if exc.status != 409:  # 409: it had ended already
                    raise GpuMagicError(exc.message) from None
            released.append(str(lease.job_id))
        if not released:
            print("%gpu: no lease to release")
        else:
            print(f"%gpu: released lease {', '.join(released)}")

    def _status_cmd(self, argv: list[str]) -> Any:
        p = _Parser("%gpu status", description="Show the cluster map, live.")
        p.parse_args(argv)
        from .widgets import ClusterMap

        widget = ClusterMap(client=self.client)
        widget.refresh()
        widget.follow()
        return widget

    def _queue_cmd(self, argv: list[str]) -> None:
        from jupyter_gpusched.cli.jobs import format_queue

        p = _Parser("%gpu queue", description="Jobs queued or running.")
        p.add_argument("--all", action="store_true", help="include ended jobs")
        p.add_argument("--limit", type=_positive_int, default=50)
        args = p.parse_args(argv)
        states = None if args.all else "queued,starting,running"
        page = self._call(self.client.list_jobs, state=states, limit=args.limit)
        print(format_queue(page["jobs"], total=page["total"]))

    def _submit_cmd(self, argv: list[str]) -> dict[str, Any]:
        p = _Parser(
            "%gpu submit",
            description="Queue a script: %gpu submit train.py "
            "[ARGS] --gpus 2 [--mem 16G]; after '--' everything goes to the script.",
        )
        _resources(p)
        p.add_argument("--name", help="display name")
        p.add_argument("--priority", choices=("interactive", "batch"))
        p.add_argument(
            "--staged",
            action="store_true",
            help="run the staged copy in the job's directory on the node "
            "(default: in this notebook's directory, for nodes sharing it)",
        )
        ours, script_args = argv, []
        if "--" in argv:
            cut = argv.index("--")
            ours, script_args = argv[:cut], argv[cut + 1 :]
        args, rest = p.parse_known_args(ours)
        rest += script_args
        if not rest:
            raise GpuMagicError("give the script to run, e.g. %gpu submit train.py --gpus 1")
        script, script_argv = rest[0], rest[1:]
        if not os.path.isfile(script):
            raise GpuMagicError(f"no file {script!r} in {os.getcwd()}")
        local = os.path.abspath(script)
        run = os.path.basename(script) if args.staged else script
        command = ["python3", run] if script.endswith(".py") else [f"./{run}"]
        spec: dict[str, Any] = {
            "kind": "script",
            "command": [*command, *script_argv],
            "files": [local],
            "name": args.name or os.path.basename(script),
            **_spec(args),
        }
        if not args.staged:
            spec["workdir"] = os.getcwd()
        if args.priority:
            spec["priority"] = args.priority
        job = self._call(self.client.submit, spec)
        print(
            f"%gpu: submitted job {job['id']} ({job['state']}); "
            f"follow it with %gpu logs {job['id']}"
        )
        return job

    def _submit_notebook_cmd(self, argv: list[str]) -> dict[str, Any]:
        from jupyter_gpusched.cli.notebooks import add_notebook_args, parse_parameter

        p = _Parser(
            "%gpu submit-notebook",
            description="Run a notebook as a batch job: "
            "%gpu submit-notebook nb.ipynb -p lr=0.1 --gpus 1 --at tonight. The "
            "executed copy comes back beside it with a timestamped name.",
        )
        add_notebook_args(p)
        _resources(p)
        args = p.parse_args(argv)
        if not os.path.isfile(args.notebook):
            raise GpuMagicError(f"no notebook {args.notebook!r} in {os.getcwd()}")
        try:
            parameters = dict(parse_parameter(text) for text in args.parameter)
        except ValueError as exc:
            raise GpuMagicError(str(exc)) from None
        body: dict[str, Any] = {
            "notebook": os.path.abspath(args.notebook),
            "parameters": parameters,
            "at": args.at,
            **_spec(args),
        }
        if args.kernel:
            body["kernel_name"] = args.kernel
        if args.name:
            body["name"] = args.name
        answer = self._call(self.client.call, "POST", "notebooks", body=body)
        if answer.get("definition"):
            d = answer["definition"]
            print(
                f"%gpu: scheduled {args.notebook} as definition {d['id']} ({args.at}); "
                "list them with 'jupyter gpusched definitions'"
            )
        else:
            job = answer["job"]
            print(
                f"%gpu: submitted {args.notebook} as job {job['id']} ({job['state']}); "
                f"follow it with %gpu logs {job['id']}"
            )
        return answer

    def _cancel_cmd(self, argv: list[str]) -> None:
        p = _Parser("%gpu cancel", description="Cancel queued or running jobs.")
        p.add_argument("ids", nargs="+", type=_positive_int, metavar="ID")
        for job_id in p.parse_args(argv).ids:
            job = self._call(self.client.cancel, job_id)
            print(f"%gpu: job {job_id} {job['state']}")

    def _logs_cmd(self, argv: list[str]) -> None:
        p = _Parser("%gpu logs", description="Print a job's output.")
        p.add_argument("id", type=_positive_int, metavar="ID")
        p.add_argument("--follow", "-f", action="store_true", help="until the job ends")
        args = p.parse_args(argv)
        if args.follow:
            for chunk in self._call(lambda: list(self.client.follow_log(args.id))):
                sys.stdout.write(chunk.decode(errors="replace"))
            return
        offset = 0
        while True:
            data, offset = self._call(self.client.read_log, args.id, offset=offset)
            if not data:
                break
            sys.stdout.write(data.decode(errors="replace"))
        sys.stdout.flush()

    def _leases_cmd(self, argv: list[str]) -> None:
        from jupyter_gpusched.cli.jobs import format_queue

        _Parser("%gpu leases", description="My live leases.").parse_args(argv)
        print(format_queue(self._call(self.client.leases)))

    def _config_cmd(self, argv: list[str]) -> None:
        p = _Parser("%gpu config", description="Which server to talk to.")
        p.add_argument("--url", help="server URL with base_url, e.g. http://127.0.0.1:8888/")
        p.add_argument("--token", default="", help="the server's token")
        args = p.parse_args(argv)
        if args.url:
            info = self._call(find_server, args.url, args.token)
            self._client = GpuSchedClient(info.url, info.token)
        print(f"%gpu: server {self.client.url}")


# ---------------------------------------------------------------------------- helpers


def _moved(lease: _Lease, answer: dict[str, Any]) -> bool:
    """Whether the server forwarded the kernel again (reconnect), or anew (after a restart)."""
    return bool(
        answer.get("generation") != lease.generation or answer.get("connection") != lease.connection
    )


def _waiting_line(job: dict[str, Any], window: dict[str, Any]) -> str:
    spec = job.get("spec", {})
    parts = [f"%%gpu: waiting for lease {job['id']} ({spec.get('gpus', 1)} GPU)"]
    if job["state"] == "queued" and job.get("position"):
        parts.append(f"#{job['position']} in the queue")
    elif job["state"] != "queued":
        parts.append(job["state"])
    if job.get("reason"):
        parts.append(str(job["reason"]))
    if window.get("name"):
        until = f" until {window['until']}" if window.get("until") else ""
        parts.append(f"window {window['name']}{until}")
    return " | ".join(parts)


def _running_line(job: dict[str, Any]) -> str:
    placement = job.get("placement") or {}
    gpus = ",".join(str(i) for i in placement.get("gpu_indices", []))
    return f"%%gpu: lease {job['id']} running on {placement.get('node', '?')} GPU {gpus}"


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%gpu`` and ``%%gpu``."""
    ipython.register_magics(GpuMagics)
