"""REST routes of notebook jobs and recurring definitions (plugin of the server extension).

``POST notebooks`` queues a notebook (or, with a cron ``at``, stores a definition);
``definitions`` lists, creates, reads, pauses/resumes/edits and deletes definitions. Errors go
through the extension's one error table (:func:`jupyter_gpusched.server.handlers.base.error_reply`).
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.utils import url_path_join
from tornado import web

from jupyter_gpusched.batch.notebooks import NotebookPlugin, plugin_for
from jupyter_gpusched.batch.requests import build_submission, parse_request
from jupyter_gpusched.core.api import (
    MAX_ID,
    MAX_LIMIT,
    MAX_OFFSET,
    DefinitionList,
    DefinitionUpdate,
    NotebookSubmitted,
    parse_body,
)
from jupyter_gpusched.core.errors import ForbiddenError, InvalidSpecError, NotFoundError
from jupyter_gpusched.store.idempotency import KeyClaim, KeyRecord

from ..idempotency import create_once
from ..outputs import output_path
from ..uploads import kept_notebook
from .base import API, ApiHandler, job_id_arg


def _definition_id(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,19}", text) or int(text) > MAX_ID:
        raise NotFoundError(
            f"definition {text} does not exist; list them with GET gpusched/api/definitions"
        )
    return int(text)


class _NotebookApi(ApiHandler):
    async def plugin(self) -> NotebookPlugin:
        """The notebook plugin of the running scheduler."""
        return plugin_for(await self.scheduler())

    def notebook_root(self, user: str) -> str:
        """Where a user's notebooks and their outputs are: the root, or their service dir."""
        if self.mode == "service":
            return os.path.join(self.user_files_dir(user), "notebooks")
        return self.server_root()

    async def submit(self, *, recurring: bool | None, claim: KeyClaim | None) -> tuple[Any, Any]:
        """Check the request, queue its job or store its definition: ``(job, definition)``.

        A notebook sent with its ``content`` is kept in the caller's notebook directory (the
        lab-wide service keeps it there, so a definition fires without its owner's server);
        when the request is refused after all, the directory is left as it was. ``claim``:
        the request's idempotency key, committed with what it makes.
        """
        plugin = await self.plugin()
        sched = plugin.scheduler
        body = self.json_body()
        mine = self.caller_limits(sched)
        if not mine.limits.off:
            self.gate.take_submit(mine)
        if isinstance(body, dict) and "user" in body:
            raise InvalidSpecError("user", "is set by the server from your login; leave it out")
        root = self.notebook_root(self.username)
        content = body.pop("content", None) if isinstance(body, dict) else None
        if content is None and self.mode == "service":
            raise InvalidSpecError(
                "content",
                "the lab's service cannot read your notebook from your machine; send its "
                "content (your Jupyter server does so for you)",
            )
        with sched.cap_in_context():  # a cap refused says what the largest node offers
            request = parse_request(body)
        if content is not None and self.mode == "service":  # kept by the service: uploaded
            size = len(self.request.body)
            self.gate.uploads.check(mine, size, lambda: self.live_files(mine.user))
        with contextlib.ExitStack() as kept:
            if content is not None:
                kept.enter_context(kept_notebook(content, request.notebook, root))
            submission = build_submission(
                request,
                user=self.username,
                root_dir=root,
                config=sched.policy,
                now=sched.clock.now(),
                recurring=recurring,
            )
            if submission.schedule is None:  # a job now or later, not a definition
                sched.check_room(mine, jobs=1)
            answer = plugin.submit(submission, claim)
        if content is not None and self.mode == "service":
            self.gate.uploads.added(self.username, len(self.request.body))
        return answer  # type: ignore[no-any-return]


class NotebooksHandler(_NotebookApi):
    """``POST notebooks``: run a notebook now, later, or on a schedule."""

    @web.authenticated
    @authorized
    async def post(self) -> None:
        """Queue the job (``at``: now/tonight/window/ISO) or store a definition (cron)."""
        plugin = await self.plugin()

        async def create(claim: KeyClaim | None) -> None:
            self._answer(plugin, *await self.submit(recurring=None, claim=claim))

        async def replay(made: KeyRecord) -> None:
            if made.target == "job":
                self._answer(plugin, plugin.scheduler.get_job(made.target_id), None)
            else:
                self._answer(plugin, None, plugin.definitions.get(made.target_id))

        await create_once(self, plugin.scheduler, "notebooks", create, replay)

    def _answer(self, plugin: NotebookPlugin, job: Any, definition: Any) -> None:
        if job is not None:
            where = url_path_join(self.base_url, API, "jobs", str(job.id))
        else:
            where = url_path_join(self.base_url, API, "definitions", str(definition.id))
        self.set_header("Location", where)
        view = None if job is None else plugin.scheduler.job_view(job, self.viewer)
        self.write_model(NotebookSubmitted(job=view, definition=definition), status=201)


class DefinitionsHandler(_NotebookApi):
    """``GET definitions`` lists; ``POST definitions`` creates one."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        """Definitions, oldest first; ``?user=me`` or a name for one user's."""
        plugin = await self.plugin()
        user = self.query("user")
        if user == "me":
            user = self.username
        limit = self.query_int("limit", 100, 0, MAX_LIMIT)
        offset = self.query_int("offset", 0, 0, MAX_OFFSET)
        items, total = plugin.definitions.list(user=user or None, limit=limit, offset=offset)
        items = [d.seen_by(self.viewer) for d in items]
        self.write_model(DefinitionList(definitions=items, total=total, limit=limit, offset=offset))

    @web.authenticated
    @authorized
    async def post(self) -> None:
        """A new recurring notebook job; ``schedule`` (cron) is required."""
        plugin = await self.plugin()

        async def create(claim: KeyClaim | None) -> None:
            _, definition = await self.submit(recurring=True, claim=claim)
            self._answer(definition)

        async def replay(made: KeyRecord) -> None:
            self._answer(plugin.definitions.get(made.target_id))

        await create_once(self, plugin.scheduler, "definitions", create, replay)

    def _answer(self, definition: Any) -> None:
        self.set_header(
            "Location", url_path_join(self.base_url, API, "definitions", str(definition.id))
        )
        self.write_model(definition, status=201)


class DefinitionHandler(_NotebookApi):
    """One definition: read, pause/resume/edit, delete."""

    @web.authenticated
    @authorized
    async def get(self, definition_id: str) -> None:
        """The definition with its latest firings."""
        plugin = await self.plugin()
        definition = plugin.definitions.get(_definition_id(definition_id))
        self.write_model(definition.seen_by(self.viewer))

    @web.authenticated
    @authorized
    async def patch(self, definition_id: str) -> None:
        """Change ``paused``, ``schedule``, ``timezone``, ``catch_up`` or ``name``."""
        plugin = await self.plugin()
        def_id = _definition_id(definition_id)
        change = parse_body(DefinitionUpdate, self.json_body(), '{"paused": true}')
        plugin.definitions.get(def_id)  # 404 before 403
        definition = plugin.definitions.update(
            def_id,
            user=self.username,
            admin=self.is_admin(),
            **change.model_dump(exclude_none=True),
        )
        self.write_model(definition.seen_by(self.viewer))

    @web.authenticated
    @authorized
    async def delete(self, definition_id: str) -> None:
        """Delete it; jobs it already made stay."""
        plugin = await self.plugin()
        definition = plugin.definitions.delete(
            _definition_id(definition_id), user=self.username, admin=self.is_admin()
        )
        self.write_model(definition.seen_by(self.viewer))


class JobOutputHandler(_NotebookApi):
    """``GET jobs/{id}/output?part=notebook|log``: a notebook job's executed copy or log."""

    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        """The file's bytes, as a download; the job's owner or an admin only."""
        sched = await self.scheduler()
        job = sched.get_job(job_id_arg(job_id))
        if job.user != self.username and not self.is_admin():
            raise ForbiddenError(
                f"job {job.id} belongs to {job.user}; only its owner or an admin may read "
                "its outputs"
            )
        part = self.query("part", "notebook") or "notebook"
        path = output_path(job, part, self.notebook_root(job.user))
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise NotFoundError(f"job {job.id}'s {part} output is gone from the server") from None
        kind = "application/x-ipynb+json" if part == "notebook" else "text/plain; charset=utf-8"
        name = os.path.basename(path).replace('"', "")
        self.set_header("Content-Disposition", f'attachment; filename="{name}"')
        self.finish(data, set_content_type=kind)


_ID = r"([^/]+)"
#: Routes under the extension's base, mounted before its catch-all 404.
handlers: list[tuple[str, type]] = [
    (f"{API}/notebooks", NotebooksHandler),
    (f"{API}/definitions", DefinitionsHandler),
    (f"{API}/definitions/{_ID}", DefinitionHandler),
    (f"{API}/jobs/{_ID}/output", JobOutputHandler),
]
