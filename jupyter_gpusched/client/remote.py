"""Run a cell in a lease's remote kernel and relay its outputs into the local cell.

Used by the ``%%gpu`` magic inside the user's own kernel: a jupyter_client kernel client is
connected to the local ports the server forwards to the remote kernel.
"""

from __future__ import annotations

import sys
import time
from typing import Any

#: How long the remote kernel may miss heartbeats before ``silent`` is asked what happened.
SILENT_AFTER_S = 3.0


class RemoteError(Exception):
    """An exception raised in the remote kernel; shows the remote traceback only."""

    def __init__(self, ename: str, evalue: str, traceback: list[str]) -> None:
        super().__init__(evalue)
        self.ename = ename
        self.evalue = evalue
        self.traceback = traceback

    def _render_traceback_(self) -> list[str]:
        return list(self.traceback) or [f"{self.ename}: {self.evalue}"]


def remote_error(content: dict[str, Any]) -> RemoteError:
    """An exception named like the remote one (the cell reports ``ZeroDivisionError``...)."""
    ename = str(content.get("ename") or "RemoteError")
    cls = type(
        ename if ename.isidentifier() else "RemoteError", (RemoteError,), {"__module__": "remote"}
    )
    return cls(ename, str(content.get("evalue") or ""), list(content.get("traceback") or []))


class RemoteResult:
    """The remote cell's ``execute_result``, displayed locally as the cell's value."""

    def __init__(self, data: dict[str, Any], metadata: dict[str, Any]) -> None:
        self.data = data
        self.metadata = metadata

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> tuple[dict, dict]:
        return self.data, self.metadata

    def __repr__(self) -> str:
        return str(self.data.get("text/plain", "<remote result>"))


class StopWaiting(Exception):
    """Ctrl-C pressed three times: the remote code ignores interrupts; stop waiting for it."""


def beating(kc: Any) -> bool:
    """Whether the remote kernel answers its heartbeat (no thread hop, unlike is_alive())."""
    return bool(kc.hb_channel.is_beating())


def run_remote(
    kc: Any,
    code: str,
    *,
    allow_stdin: bool = False,
    tick: Any = None,
    silent: Any = None,
) -> RemoteResult | None:
    """Execute ``code`` through ``kc`` and relay its outputs into the running local cell.

    Streams, displays (and their updates) and clear_output are re-published as they arrive;
    the ``execute_result`` is returned (its repr shows as the cell's value); an error raises
    :class:`RemoteError`. Ctrl-C sends ``interrupt_request`` on the control channel and keeps
    relaying (the remote ``KeyboardInterrupt`` comes back as the error); the third raises
    :class:`StopWaiting`. ``tick()`` runs every poll; ``silent(started)`` runs after
    :data:`SILENT_AFTER_S` without heartbeat (it may raise to give up).
    """
    import queue

    import zmq

    msg_id = kc.execute(code, store_history=True, allow_stdin=allow_stdin)
    poller = zmq.Poller()
    poller.register(kc.iopub_channel.socket, zmq.POLLIN)
    if allow_stdin:
        poller.register(kc.stdin_channel.socket, zmq.POLLIN)
    result: RemoteResult | None = None
    error: dict[str, Any] | None = None
    silent_since: float | None = None
    started = idle = False
    interrupts = 0
    while not idle:
        try:
            ready = dict(poller.poll(200))
            if tick is not None:
                tick()
            if not ready:
                if beating(kc):
                    silent_since = None
                    continue
                silent_since = silent_since or time.monotonic()
                if time.monotonic() - silent_since > SILENT_AFTER_S and silent is not None:
                    silent(started)
                    silent_since = None
                continue
            if allow_stdin and kc.stdin_channel.socket in ready:
                _answer_input(kc)
            while not idle:
                try:
                    msg = kc.iopub_channel.get_msg(timeout=0)
                except queue.Empty:
                    break
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                started = True
                kind, content = msg["msg_type"], msg["content"]
                if kind == "status":
                    idle = content.get("execution_state") == "idle"
                elif kind == "execute_result":
                    result = RemoteResult(content.get("data", {}), content.get("metadata", {}))
                elif kind == "error":
                    error = content
                else:
                    _relay(kind, content)
        except KeyboardInterrupt:
            interrupts += 1
            if interrupts >= 3:
                raise StopWaiting from None
            kc.control_channel.send(kc.session.msg("interrupt_request", {}))
    reply = _shell_reply(kc, msg_id)
    if error is None and reply is not None and reply["content"].get("status") == "error":
        error = reply["content"]
    if error is not None:
        raise remote_error(error)
    return result


def _relay(kind: str, content: dict[str, Any]) -> None:
    """Show one remote IOPub output in the local cell."""
    from IPython.display import clear_output, publish_display_data

    if kind == "stream":
        stream = sys.stderr if content.get("name") == "stderr" else sys.stdout
        stream.write(content.get("text", ""))
        stream.flush()  # arrives in the cell as it came, in order with displays
    elif kind in ("display_data", "update_display_data"):
        publish_display_data(
            content.get("data", {}),
            content.get("metadata", {}),
            transient=content.get("transient") or {},
            update=kind == "update_display_data",
        )
    elif kind == "clear_output":
        clear_output(wait=bool(content.get("wait")))


def _answer_input(kc: Any) -> None:
    import queue

    try:
        msg = kc.stdin_channel.get_msg(timeout=0)
    except queue.Empty:
        return
    if msg["msg_type"] != "input_request":
        return
    prompt = msg["content"].get("prompt", "")
    if msg["content"].get("password"):
        import getpass

        kc.input(getpass.getpass(prompt))
    else:
        kc.input(input(prompt))


def _shell_reply(kc: Any, msg_id: str) -> dict[str, Any] | None:
    import queue

    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            msg = kc.shell_channel.get_msg(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg
    return None
