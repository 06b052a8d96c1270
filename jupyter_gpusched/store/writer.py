"""A child process that commits new jobs' rows, so a submit's transaction is off the server's GIL.

Group commit (:mod:`jupyter_gpusched.scheduling.submits`) wrote each batch of submissions in
a worker thread. That thread shares the GIL with the event loop: building the statements and
running SQLAlchemy's session cost a 4-job transaction 2.8 ms there against 0.88 ms alone, and
with 8 clients it was the largest share of a submit. Here the server builds each row's column
values (it keeps them for its job cache anyway) and a child process inserts them and their
``submitted`` events in one transaction of its own, on the other core. The waiting reasons
the passes those submits wake find for the new jobs go the same way (one transaction a pass,
3-4 ms of the server's CPU each under load when written in its thread).

Everything else a transaction must do is the same as in the server: the child opens the store
through :class:`~.store.Store`, so fencing, the events lock on PostgreSQL and failing fast when
the store is away (:func:`~.availability.for_the_loop`) apply unchanged.

The wire is the child's stdin and stdout: length-prefixed pickles, one request at a time (an
operation, its payload, the leader's fence; a lock keeps the server's callers in turn). The
store's URL goes over stdin too, never on the
command line where ``ps`` shows passwords. The child exits when its stdin closes: when the
server stops, or when it dies (``kill -9`` included). A child that dies fails the batch it
held with :class:`~jupyter_gpusched.core.errors.UnavailableError` (it may or may not have
committed); the next batch is written in the server's thread while a new child starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
import signal
import struct
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

from sqlalchemy.engine import make_url

from jupyter_gpusched.core.errors import GpuSchedError, UnavailableError

from .availability import for_the_loop, off_the_loop
from .leader import current_fence, fenced

if TYPE_CHECKING:
    from .idempotency import KeyClaim
    from .reasons import ReasonChange
    from .store import Store

log = logging.getLogger(__name__)

_LENGTH = struct.Struct("!I")
#: How long a stopping server waits for the child to finish its batch and exit.
STOP_WAIT_S = 5.0
#: How long after a failed start the next submit tries to start the child again.
RETRY_START_S = 30.0


def usable_for(url: str) -> bool:
    """A second process can open this store: a SQLite file or a server, not ``sqlite://``."""
    parsed = make_url(url)
    return parsed.get_backend_name() != "sqlite" or parsed.database not in (None, "", ":memory:")


class StoreWriter:
    """The server's side: starts the child when first asked and sends it batches of rows.

    The child takes about half a second to import and open the store; until it says it is
    ready, :meth:`ready` is False and callers write in a thread as before, so no submit waits
    for it (and a server that is never sent a job never starts one).
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self._proc: asyncio.subprocess.Process | None = None
        self._ready = False
        self._starting: asyncio.Task[None] | None = None
        self._retry_at = 0.0  # loop time before which a failed start is not tried again
        self._lock = asyncio.Lock()

    def ready(self) -> bool:
        """Whether batches can go to the child now; if not, start one (in the background)."""
        if self._ready and self._proc is not None and self._proc.returncode is None:
            return True
        self._ready = False
        loop = asyncio.get_running_loop()
        if (self._starting is None or self._starting.done()) and loop.time() >= self._retry_at:
            self._starting = loop.create_task(self._start(), name="gpusched-store-writer")
        return False

    async def insert_queued(
        self,
        values: Sequence[Mapping[str, Any]],
        claims: Sequence[KeyClaim | None] | None,
        fence: tuple[str, int] | None,
    ) -> list[int]:
        """Insert queued jobs' rows, their keys and events in one transaction; their new ids."""
        unknown = (
            "whether these jobs were queued is unknown: submit again with the same "
            "Idempotency-Key, or list your jobs before submitting them again"
        )
        payload = (list(values), None if claims is None else list(claims))
        return list(await self._call("insert", payload, fence, unknown))

    async def write_reasons(
        self, reasons: Mapping[int, str | None], fence: tuple[str, int] | None
    ) -> list[ReasonChange]:
        """:meth:`Store.write_reasons` in the child; what it changed."""
        lost = "these waiting reasons may not be written (the next full pass writes them)"
        return list(await self._call("reasons", dict(reasons), fence, lost))

    async def _call(
        self, op: str, payload: object, fence: tuple[str, int] | None, if_gone: str
    ) -> Any:
        async with self._lock:
            try:
                ok, answer = await self._ask(self._proc, (op, payload, fence))
            except (OSError, asyncio.IncompleteReadError, EOFError) as exc:
                await self._reap()
                raise UnavailableError(
                    f"the store writer process exited ({exc or type(exc).__name__}); {if_gone}",
                    retry_after_s=1.0,
                ) from None
        if ok:
            return answer
        raise answer

    async def close(self) -> None:
        """Let the child finish its batch and exit (closing its stdin is its signal)."""
        if self._starting is not None:
            self._starting.cancel()
            await asyncio.gather(self._starting, return_exceptions=True)
        async with self._lock:
            proc, self._proc, self._ready = self._proc, None, False
            if proc is None:
                return
            if proc.stdin is not None:
                proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), STOP_WAIT_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):  # it exited meanwhile (a busy box)
                    proc.kill()
                await proc.wait()

    async def _start(self) -> None:
        async with self._lock:
            try:
                self._proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-P",  # not the server's working directory first on sys.path
                    "-m",
                    __name__,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                )
                ok, answer = await self._ask(self._proc, self._url)
            except (OSError, asyncio.IncompleteReadError, EOFError) as exc:
                ok, answer = False, exc
            if ok:
                self._ready = True
                return
            log.warning(
                "gpusched: the store writer process did not start (%s); submits are written "
                "in a thread of the server meanwhile",
                answer,
            )
            await self._reap()
            self._retry_at = asyncio.get_running_loop().time() + RETRY_START_S

    @staticmethod
    async def _ask(proc: asyncio.subprocess.Process | None, request: object) -> Any:
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise EOFError("not started")
        proc.stdin.write(_frame(request))
        await proc.stdin.drain()
        (size,) = _LENGTH.unpack(await proc.stdout.readexactly(_LENGTH.size))
        return pickle.loads(await proc.stdout.readexactly(size))  # noqa: S301 (our own child)

    async def _reap(self) -> None:
        proc, self._proc, self._ready = self._proc, None, False
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


async def set_reasons(
    store: Store, writer: StoreWriter | None, reasons: Mapping[int, str | None]
) -> None:
    """:meth:`Store.set_reasons` in ``writer``'s child when it is up, else in a worker thread.

    Never on the event loop: waiting for the write lock, which a group commit holds, would
    stall every request.
    """
    if writer is not None and writer.ready():
        store.reasons_written(await writer.write_reasons(reasons, current_fence()))
    else:
        await off_the_loop(store.set_reasons, reasons)


def _frame(obj: object) -> bytes:
    """One message on the wire, either way: its length, then its pickle."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(data)) + data


# -- the child ---------------------------------------------------------------------------------


def _read(stream: BinaryIO) -> Any:
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError
    (size,) = _LENGTH.unpack(head)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)  # noqa: S301 (from the server that started us, over a pipe)


def _write(stream: BinaryIO, obj: object) -> None:
    stream.write(_frame(obj))
    stream.flush()


def _answer(store: Store, op: str, payload: Any, fence: tuple[str, int] | None) -> object:
    try:
        with for_the_loop(), contextlib.ExitStack() as stack:
            if fence is not None:
                stack.enter_context(fenced(*fence))
            if op == "insert":
                values, claims = payload
                return (True, store.insert_queued(values, claims))
            if op == "reasons":
                return (True, store.write_reasons(payload))
            return (False, RuntimeError(f"the store writer has no operation {op!r}"))
    except GpuSchedError as exc:
        try:  # the server raises it as it is (NotLeaderError, UnavailableError with its pause)
            pickle.loads(pickle.dumps(exc))  # noqa: S301 (our own object)
        except Exception:
            return (False, RuntimeError(f"{type(exc).__name__}: {exc}"))
        return (False, exc)
    except Exception as exc:  # a bug: the server answers 500 with what it was
        log.exception("gpusched store writer: a batch failed")
        return (False, RuntimeError(f"the store writer failed: {type(exc).__name__}: {exc}"))


def main() -> None:
    """Serve batches from stdin until it closes."""
    # A Ctrl-C, or a service manager's SIGTERM to the whole group, is the server's to handle:
    # it may still send the batches it holds, and its exit closes our stdin.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    logging.basicConfig(format="[gpusched store writer] %(levelname)s %(message)s")
    from jupyter_gpusched.core.clock import SystemClock

    from .store import Store

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write to the reply pipe
    try:
        url = _read(stdin)
    except EOFError:
        return
    try:
        store = Store(url, clock=SystemClock())
    except Exception as exc:
        _write(stdout, (False, f"{type(exc).__name__}: {exc}"))
        return
    try:
        _write(stdout, (True, None))
        while True:
            try:
                op, payload, fence = _read(stdin)
            except EOFError:
                return
            _write(stdout, _answer(store, op, payload, fence))
    except BrokenPipeError:  # the server is gone
        return
    finally:
        store.close()


if __name__ == "__main__":
    main()
