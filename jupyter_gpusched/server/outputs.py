"""Executed notebooks come home: the service keeps them, the user's server copies them back.

Scheduled notebooks run whether or not their owner's server is up, and the service keeps each
executed notebook and its log in the owner's directory (under the same relative path the input
had in the owner's root). When the owner's server runs in client mode it asks, at start and then
every ``interval_s``, for its user's finished notebook jobs and copies each output it has not
copied before beside the input in its root -- so after a weekend away the Monday-morning
outputs are simply there. The panel can also download an output at any time
(``GET jobs/{id}/output``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from typing import Any

from tornado import httpclient

from jupyter_gpusched.node.stage import private_folder

from .client_mode import ServiceLink
from .uploads import inside

log = logging.getLogger(__name__)

#: The parts of a notebook job's ``outputs`` the service keeps (relative paths).
OUTPUT_PARTS = ("notebook", "log")
_ENDED = "succeeded,failed,cancelled"


class OutputSync:
    """Copies this server's user's notebook outputs from the service into the root."""

    def __init__(
        self, link: ServiceLink, root: str, *, interval_s: float = 30.0, state_file: str = ""
    ) -> None:
        self.link = link
        self.root = root
        self.interval_s = interval_s
        if not state_file:
            from jupyter_core.paths import jupyter_data_dir

            state_file = os.path.join(jupyter_data_dir(), "gpusched", "copied-outputs.json")
        self.state_file = state_file
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Copy now, then every ``interval_s``, in the background."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="gpusched-outputs")

    async def stop(self) -> None:
        """Stop copying."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self.sync()
            except Exception as exc:  # the service may be down for a while: try again later
                log.info("gpusched: could not copy notebook outputs from the service: %s", exc)
            await asyncio.sleep(self.interval_s)

    async def sync(self) -> list[str]:
        """Copy every output not copied before; the paths written (relative to the root)."""
        done = self._load()
        client = httpclient.AsyncHTTPClient()
        page = await client.fetch(
            self.link.api_url("jobs", f"user=me&kind=notebook&state={_ENDED}&limit=200"),
            headers=self.link.headers(),
        )
        written = []
        for job in json.loads(page.body).get("jobs", []):
            outputs = job.get("outputs") or {}
            for part in OUTPUT_PARTS:
                rel = outputs.get(part)
                key = f"{job['id']}:{part}"
                if not rel or key in done:
                    continue
                target = inside(self.root, rel)
                if not os.path.exists(target):
                    answer = await client.fetch(
                        self.link.api_url(f"jobs/{job['id']}/output", f"part={part}"),
                        headers=self.link.headers(),
                    )
                    private_folder(os.path.dirname(target))
                    tmp = f"{target}.gpusched-tmp"
                    # 0600 like the embedded server's copies: it holds the parameters
                    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                    with os.fdopen(os.open(tmp, flags, 0o600), "wb") as f:
                        f.write(answer.body)
                    os.replace(tmp, target)
                    written.append(rel)
                done.add(key)
        self._save(done)
        return written

    def _load(self) -> set[str]:
        try:
            with open(self.state_file) as f:
                return set(json.load(f))
        except (OSError, ValueError):
            return set()

    def _save(self, done: set[str]) -> None:
        private_folder(os.path.dirname(self.state_file))
        tmp = f"{self.state_file}.tmp"
        with open(tmp, "w") as f:
            json.dump(sorted(done), f)
        os.replace(tmp, self.state_file)


def output_path(job: Any, part: str, root: str) -> str:
    """The file of a job's output ``part`` (notebook or log) under ``root``, checked inside it."""
    if part not in OUTPUT_PARTS:
        from jupyter_gpusched.core.errors import InvalidSpecError

        raise InvalidSpecError("part", f"{part!r} is not one of {sorted(OUTPUT_PARTS)}")
    rel = (job.handle.get("outputs") or {}).get(part)
    if not rel:
        from jupyter_gpusched.core.errors import NotFoundError

        raise NotFoundError(f"job {job.id} has no {part} output (yet)")
    return inside(root, rel)
