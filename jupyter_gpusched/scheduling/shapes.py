"""Each queued job's request shape, worked out once per spec rather than once per pass.

A pass over a long queue of jobs that fit nowhere asks the same few questions of thousands of
jobs: what they request (a packer request), whether the rules admit them, whether that request
fit a moment ago. Building the request and hashing it for each job in every pass was a third of
such a pass. A job's spec is the same object from pass to pass while its row's spec is
unchanged (the store's job cache keeps it), so what is derived from it is kept with it.
"""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import NamedTuple

from jupyter_gpusched.core import policy
from jupyter_gpusched.core.models import Job, JobSpec, PriorityClass
from jupyter_gpusched.packing import packer
from jupyter_gpusched.packing.inventory import pack_request

#: Distinct requests remembered before starting over (a memo, not a record).
_MAX_SHAPES = 10_000


class Shape(NamedTuple):
    """What a pass needs of a job's spec; ``key`` and ``admit_key`` are cheap to hash."""

    spec: JobSpec  # the spec it was derived from (compared by identity)
    request: packer.PackRequest
    key: int  # equal requests, equal keys (while remembered)
    admit_key: tuple[PriorityClass, float | None, datetime | None, float]  # what admit reads


class Shapes:
    """Shapes of the jobs the last pass saw; a pass keeps only those of the jobs it sees."""

    def __init__(self) -> None:
        self._seen: dict[int, Shape] = {}  # by job id, this pass
        self._before: dict[int, Shape] = {}  # by job id, the pass before
        self._keys: dict[packer.PackRequest, int] = {}
        self._next_key = itertools.count()  # never reused: a key always means one request

    def begin_pass(self) -> None:
        """Forget jobs the last pass did not see (ended, placed, cancelled)."""
        self._before, self._seen = self._seen, {}

    def of(self, job: Job) -> Shape:
        """``job``'s shape, derived again only when its spec changed."""
        shape = self._seen.get(job.id) or self._before.get(job.id)
        if shape is None or shape.spec is not job.spec:
            shape = self._derive(job)
        self._seen[job.id] = shape
        return shape

    def _derive(self, job: Job) -> Shape:
        spec = job.spec
        request = pack_request(spec)
        key = self._keys.get(request)
        if key is None:
            if len(self._keys) >= _MAX_SHAPES:
                self._keys.clear()
            key = self._keys[request] = next(self._next_key)
        admit_key = (spec.priority_class, spec.max_runtime_s, spec.not_before, policy.job_gpus(job))
        return Shape(spec, request, key, admit_key)
