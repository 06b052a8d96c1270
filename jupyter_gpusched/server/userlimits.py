"""The per-user limits a server counts itself: request rates, open streams, files held.

What the policy says each user may have is :mod:`jupyter_gpusched.core.limits`; the jobs a user
has queued are counted in the store (:meth:`~jupyter_gpusched.scheduling.actions.JobActions.
check_room`). What lives only in this process is counted here, one :class:`LimitGate` per
server (``settings["gpusched_gate"]``): the token bucket of each user's creating requests, the
streams each holds open (event websockets and log follows: tied to this process), and the
bytes of each user's uploads and stored notebooks on this server's disk, whose uploads of ended
jobs :class:`UploadLedger` removes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import re
import shutil
import time
from collections.abc import Callable, Collection, Iterable
from typing import Any

from jupyter_gpusched.core.errors import TooManyError, UnavailableError
from jupyter_gpusched.core.limits import RETRY_AFTER_S, Bucket, UserLimits, refusal, take_token
from jupyter_gpusched.core.models import TERMINAL_STATES, Job, JobState
from jupyter_gpusched.store.availability import off_the_loop

log = logging.getLogger(__name__)

#: Executed copies and logs of notebook jobs that come back beside the input: not uploads.
_OUTPUT_NAME = re.compile(r"-job\d+(-\d+)?\.(ipynb|log)$")


class LimitGate:
    """Rate buckets and open streams per user, and the upload ledger, of one server."""

    def __init__(
        self,
        data_dir: str,
        *,
        max_follows: int = 4,
        count_notebooks: bool = False,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_follows = max_follows  # GpuSchedApp.max_follows_per_user, in every mode
        self._monotonic = monotonic
        self._buckets: dict[str, Bucket] = {}
        self._streams: dict[str, int] = {}
        self._follows: dict[str, int] = {}
        self.uploads = UploadLedger(data_dir, count_notebooks=count_notebooks)
        self._janitor: UploadJanitor | None = None

    @classmethod
    def of(cls, app: Any) -> LimitGate:
        """The gate of a :class:`~.app.GpuSchedApp` (its data dir, mode and follows)."""
        return cls(
            app.settings["gpusched_data_dir"],
            max_follows=app.max_follows_per_user,
            count_notebooks=app.mode == "service",  # notebooks are kept in the service's files
        )

    def watch(self, scheduler: Any) -> None:
        """Remove the uploads of ``scheduler``'s ended jobs from now on (an end hook of it)."""
        self._janitor = UploadJanitor(self.uploads, scheduler.store)
        scheduler.end_hooks.append(self._janitor.on_end)
        self._janitor.start()

    async def close(self) -> None:
        """Stop removing uploads (what is left is found by the next start's sweep)."""
        if self._janitor is not None:
            await self._janitor.stop()
            self._janitor = None

    def take_submit(self, mine: UserLimits) -> None:
        """Count one creating request; 429 (with the wait) past ``submits_per_s``."""
        bucket, wait_s = take_token(self._buckets.get(mine.user), mine.limits, self._monotonic())
        if bucket is not None:
            self._buckets[mine.user] = bucket
        if wait_s > 0:
            raise TooManyError(refusal(mine, "submits_per_s", 0, wait_s), retry_after_s=wait_s)

    def streams_of(self, user: str) -> int:
        """Streams ``user`` holds open on this server."""
        return self._streams.get(user, 0)

    def open_stream(self, mine: UserLimits, *, follow: bool = False) -> Callable[[], None]:
        """Count a stream ``mine.user`` opens; 429 past the limits. Call the answer to close it.

        A log follow holds an SSH channel on its job's node: besides ``streams`` it counts
        against ``max_follows``. Closing twice closes once.
        """
        user = mine.user
        if follow and self._follows.get(user, 0) >= self.max_follows:
            raise TooManyError(
                f"{user} already follows {self.max_follows} logs "
                "(GpuSchedApp.max_follows_per_user); close one, or read with offset and limit",
                retry_after_s=RETRY_AFTER_S["streams"],
            )
        limit, have = mine.limits.streams, self._streams.get(user, 0)
        if limit is not None and have >= limit:
            raise TooManyError(
                refusal(mine, "streams", have), retry_after_s=RETRY_AFTER_S["streams"]
            )
        self._streams[user] = have + 1
        if follow:
            self._follows[user] = self._follows.get(user, 0) + 1
        closed = False

        def close() -> None:
            nonlocal closed
            if closed:
                return
            closed = True
            _drop(self._streams, user)
            if follow:
                _drop(self._follows, user)

        return close


def _drop(counts: dict[str, int], user: str) -> None:
    left = counts.get(user, 0) - 1
    if left > 0:
        counts[user] = left
    else:
        counts.pop(user, None)


class UploadLedger:
    """Bytes each user holds in uploaded files (and, in the service, stored notebooks).

    Held means held for jobs that have not ended: the uploads of an ended job are removed
    (:meth:`sweep`, run for the owners of ended jobs and before a request is refused), so a
    rejected or finished request leaves nothing behind. A user's total is read from disk at
    most every ``reread_s`` and kept up to date in between by what this server writes.
    Stored notebooks stay (recurring definitions stage them again); executed copies and logs
    that come back beside them are not counted.
    """

    def __init__(
        self,
        data_dir: str,
        *,
        count_notebooks: bool = False,
        reread_s: float = 300.0,
        grace_s: float = 120.0,
    ) -> None:
        self.data_dir = data_dir
        self.count_notebooks = count_notebooks
        self.reread_s = reread_s
        # An upload directory younger than this is never removed: its request may still be
        # on its way into the store (here or at another server sharing the directory).
        self.grace_s = grace_s
        self._held: dict[str, tuple[int, float]] = {}  # user -> (bytes, when read)
        self.fresh: set[str] = set()  # upload directories of requests under way here
        # Upload directories of requests this server answered: a sweep needs no grace for
        # them (their jobs are in the store, or their request failed).
        self.answered: set[str] = set()

    def held(self, user: str) -> int:
        """Bytes ``user`` holds now (read from disk when the last reading is old)."""
        known = self._held.get(user)
        if known is None or time.monotonic() - known[1] > self.reread_s:
            known = (self._read(user), time.monotonic())
            self._held[user] = known
        return known[0]

    def forget(self, user: str) -> None:
        """Read ``user``'s total from disk next time (files went away)."""
        self._held.pop(user, None)

    def added(self, user: str, size: int) -> None:
        """``size`` bytes were just written for ``user``."""
        if (known := self._held.get(user)) is not None:
            self._held[user] = (known[0] + size, known[1])

    def check(self, mine: UserLimits, incoming: int, live: Callable[[], Collection[str]]) -> None:
        """Refuse (429) ``incoming`` more bytes past ``upload_bytes``.

        Before refusing, the user's uploads that no live job names (``live()``: the files of
        their jobs not yet ended) are removed, and the total read again.
        """
        limit = mine.limits.upload_bytes
        if limit is None:
            return
        if self.held(mine.user) + incoming > limit:
            self.sweep(mine.user, live())
        have = self.held(mine.user)
        if have + incoming > limit:
            raise TooManyError(
                refusal(mine, "upload_bytes", have, incoming),
                retry_after_s=RETRY_AFTER_S["upload_bytes"],
            )

    def sweep(self, user: str, live_files: Iterable[str]) -> int:
        """Remove ``user``'s upload directories that no live job names; the bytes freed."""
        folder = self.folder(user)
        try:
            names = os.listdir(folder)
        except OSError:
            return 0
        wanted = upload_dirs(folder, live_files)
        freed = 0
        now = time.time()
        for name in names:
            path = os.path.join(folder, name)
            if path in wanted or path in self.fresh:
                continue
            try:
                if path not in self.answered and now - os.lstat(path).st_mtime < self.grace_s:
                    continue
            except OSError:
                continue
            self.answered.discard(path)
            size = _size(path)
            shutil.rmtree(path, ignore_errors=True)
            freed += size
        self._held.pop(user, None)  # read again from disk next time
        if freed:
            log.info("gpusched: removed %d bytes of %s's uploads no live job needs", freed, user)
        return freed

    def folder(self, user: str) -> str:
        """Where ``user``'s uploads are: one directory per request under it."""
        return os.path.join(self.data_dir, "users", user, "uploads")

    def release(self, user: str, dirs: Iterable[str], live_files: Iterable[str]) -> int:
        """Remove those of ``dirs`` (upload directories of ended jobs) no live job names."""
        named = upload_dirs(self.folder(user), live_files)
        freed = 0
        for path in set(dirs) - named:
            self.answered.discard(path)
            size = _size(path)
            shutil.rmtree(path, ignore_errors=True)
            freed += size
        if freed:
            self._held.pop(user, None)
        return freed

    def users(self) -> list[str]:
        """Users that have an uploads directory on this server."""
        root = os.path.join(self.data_dir, "users")
        with contextlib.suppress(OSError):
            return sorted(u for u in os.listdir(root) if os.path.isdir(os.path.join(root, u)))
        return []

    def _read(self, user: str) -> int:
        base = os.path.join(self.data_dir, "users", user)
        total = _size(os.path.join(base, "uploads"))
        if self.count_notebooks:
            total += _size(os.path.join(base, "notebooks"), skip=_OUTPUT_NAME)
        return total


def upload_dirs(folder: str, paths: Iterable[str]) -> set[str]:
    """The upload directories (``folder/<request>``) that ``paths`` lie in."""
    prefix = folder.rstrip(os.sep) + os.sep
    return {
        prefix + path[len(prefix) :].split(os.sep, 1)[0]
        for path in paths
        if path.startswith(prefix) and len(path) > len(prefix)
    }


def _size(path: str, skip: re.Pattern[str] | None = None) -> int:
    """Bytes of the files under ``path`` (links not followed); 0 when there is none."""
    total = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            if skip is not None and skip.search(name):
                continue
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


class UploadJanitor:
    """Removes the uploads of ended jobs, and every hour those no live job names.

    An end hook of the scheduler notes each ended job's upload directories; shortly after
    (ends come in bursts: an array's tasks), each is removed unless a job still live names
    it (the other tasks of an array share their request's directory). Every ``sweep_every_s``
    each user's directories that no live job names are swept (a crash between writing and
    queueing, a job cancelled before it started), ``UploadLedger.grace_s`` after their
    writing at the earliest.
    """

    def __init__(
        self,
        ledger: UploadLedger,
        store: Any,
        *,
        gather_s: float = 1.0,
        sweep_every_s: float = 3600.0,
    ) -> None:
        self.ledger = ledger
        self.store = store
        self.gather_s = gather_s
        self.sweep_every_s = sweep_every_s
        self._ended: dict[str, set[str]] = {}  # user -> upload directories of ended jobs
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def on_end(self, job: Job) -> None:
        """End hook: note the job's upload directories (removed by the next round)."""
        dirs = upload_dirs(self.ledger.folder(job.user), job.spec.files)
        if dirs:
            self._ended.setdefault(job.user, set()).update(dirs)
            self._wake.set()

    def start(self) -> None:
        """Run the rounds in the background."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="gpusched-uploads")

    async def stop(self) -> None:
        """Stop (what is left is found by the next start's sweep)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        swept_at = -math.inf
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.sweep_every_s):
                    await self._wake.wait()
                    await asyncio.sleep(self.gather_s)
            self._wake.clear()
            ended, self._ended = self._ended, {}
            sweep = time.monotonic() - swept_at >= self.sweep_every_s
            users = sorted({*ended, *(self.ledger.users() if sweep else ())})
            if sweep:
                swept_at = time.monotonic()
            for user in users:
                try:
                    await off_the_loop(self._round, user, ended.get(user, set()), sweep)
                except UnavailableError:
                    self._ended.setdefault(user, set()).update(ended.get(user, ()))
                except Exception:  # one user's files must not stop the others'
                    log.exception("gpusched: cleaning %s's uploads failed", user)

    def _round(self, user: str, ended: set[str], sweep: bool) -> None:
        live_states = [s for s in JobState if s not in TERMINAL_STATES]
        jobs, _ = self.store.list_jobs(states=live_states, user=user, limit=None, shared=True)
        live = {path for job in jobs for path in job.spec.files}
        self.ledger.release(user, ended, live)
        if sweep:
            self.ledger.sweep(user, live)
