"""Array routes: an array kept as one record, and its tasks by index (``ID_7``)."""

from __future__ import annotations

import re

from jupyter_server.auth.decorator import authorized
from tornado import web

from jupyter_gpusched.core.api import MAX_ARRAY_TASKS, ArrayCancelled
from jupyter_gpusched.core.errors import NotFoundError

from .base import API, ID, ApiHandler, job_id_arg


def task_index_arg(text: str) -> int:
    """A task index from the URL; anything that cannot be one is a 404."""
    if not re.fullmatch(r"[0-9]{1,9}", text) or int(text) >= MAX_ARRAY_TASKS:
        raise NotFoundError(f"task {text} does not exist; tasks are numbered from 0")
    return int(text)


class ArrayHandler(ApiHandler):
    """``GET arrays/{id}``: the array and its counts; ``DELETE``: cancel all of it."""

    @web.authenticated
    @authorized
    async def get(self, array_id: str) -> None:
        """The array: size, pending range, its tasks' counts by state, why it waits."""
        sched = await self.scheduler()
        record = sched.array_record(job_id_arg(array_id))
        (view,) = sched.array_views([record], self.viewer)
        self.write_model(view)

    @web.authenticated
    @authorized
    async def delete(self, array_id: str) -> None:
        """Cancel the pending tasks (one statement) and every live task (owner or admin)."""
        sched = await self.scheduler()
        aid = job_id_arg(array_id)
        pending, jobs = await sched.cancel_array(aid, user=self.username, admin=self.is_admin())
        (view,) = sched.array_views([sched.array_record(aid)], self.viewer)
        self.write_model(ArrayCancelled(array=view, pending=pending, jobs=[j.id for j in jobs]))


class ArrayTaskHandler(ApiHandler):
    """``GET arrays/{id}/tasks/{index}``: one task; ``DELETE``: cancel it."""

    @web.authenticated
    @authorized
    async def get(self, array_id: str, index: str) -> None:
        """The task's job once made, or a line saying it has not started."""
        sched = await self.scheduler()
        task = sched.array_task(job_id_arg(array_id), task_index_arg(index), self.viewer)
        self.write_model(task)

    @web.authenticated
    @authorized
    async def delete(self, array_id: str, index: str) -> None:
        """Cancel the task: a pending one never becomes a job (owner or admin)."""
        sched = await self.scheduler()
        task = await sched.cancel_array_task(
            job_id_arg(array_id),
            task_index_arg(index),
            user=self.username,
            admin=self.is_admin(),
        )
        self.write_model(task)


handlers: list[tuple[str, type]] = [
    (f"{API}/arrays/{ID}", ArrayHandler),
    (f"{API}/arrays/{ID}/tasks/{ID}", ArrayTaskHandler),
]
