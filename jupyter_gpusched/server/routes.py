"""The API's routes as documented: paths, methods, bodies, status codes, query arguments.

:mod:`.openapi` turns this table and the models of :mod:`jupyter_gpusched.core.api` into the
OpenAPI file; a test checks it lists exactly the routes the handlers serve. Imports no
tornado, so generating the file needs no server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from jupyter_gpusched.core import api

#: Every path lies under the server's base URL plus this.
PREFIX = "/gpusched/api"

#: Error status -> (shared response name, when it happens).
ERRORS: dict[int, tuple[str, str]] = {
    400: ("BadRequest", "The body could not be read (not JSON)."),
    401: ("Unauthorized", "No valid token or cookie."),
    403: ("Forbidden", "Not the job's owner nor an admin, or not authorized for this resource."),
    404: ("NotFound", "No such job, lease or definition (or not a lease)."),
    409: (
        "Conflict",
        "The job's state forbids the change (e.g. it already finished); on a create, a "
        "request with the same `Idempotency-Key` is still being answered: send it again after "
        "`Retry-After` seconds.",
    ),
    413: (
        "TooLarge",
        "The request body is larger than the server reads (the message says the limit).",
    ),
    422: ("Invalid", "A field or query argument is invalid, or the job can never fit."),
    429: (
        "TooMany",
        "Over one of the caller's per-user limits (queued jobs, leases, streams, upload bytes, "
        "submissions per second; `GpuSchedPolicy.limits`) or their log follows: the message "
        "names the limit and the caller's count; try again after `Retry-After` seconds.",
    ),
    502: ("Unreachable", "A node could not be reached."),
    503: (
        "Unavailable",
        "The scheduler has not started (yet), or its store cannot be reached; "
        "try again after `Retry-After` seconds.",
    ),
}

#: Schemas not reached from a route but part of the API (the events websocket's messages).
EXTRA_MODELS: tuple[type[BaseModel], ...] = (api.EventMessage,)


@dataclass(frozen=True)
class Param:
    """One query argument."""

    name: str
    schema: dict[str, Any]
    description: str | None = None


@dataclass(frozen=True)
class Op:
    """One method of a path: what it takes, what it answers, which errors it may answer."""

    method: str
    operation_id: str
    summary: str
    # a model (JSON), models one of which answers, or a media type answering text
    response: type[BaseModel] | tuple[type[BaseModel], ...] | str
    errors: tuple[int, ...]
    ok: int = 200
    ok_description: str = "OK."
    body: type[BaseModel] | tuple[type[BaseModel], ...] | None = None  # a tuple: one of them
    query: tuple[Param, ...] = ()
    description: str | None = None
    location: str | None = None  # 201: what the Location header names


@dataclass(frozen=True)
class Route:
    """A path under ``PREFIX`` (``{name}`` marks an id in the path) and its methods."""

    path: str
    ops: tuple[Op, ...]


def int_schema(lo: int, hi: int | None = None, default: int | None = None) -> dict[str, Any]:
    """An integer's JSON schema: at least ``lo``, at most ``hi``."""
    schema: dict[str, Any] = {"type": "integer", "minimum": lo}
    if hi is not None:
        schema["maximum"] = hi
    if default is not None:
        schema["default"] = default
    return schema


_USER = Param("user", {"type": "string"}, "Owner's name, or `me` for the caller.")
_PAGE = (
    Param("limit", int_schema(0, api.MAX_LIMIT, 100)),
    Param("offset", int_schema(0, api.MAX_OFFSET, 0)),
)
_READ, _WRITE = (401, 403, 503), (400, 401, 403, 413, 422, 503)
# Creates count against the caller's per-user limits, and answer 409 while a request with
# their Idempotency-Key is still being answered.
_CREATE = (*_WRITE, 409, 429)

ROUTES: tuple[Route, ...] = (
    Route(
        "/jobs",
        (
            Op(
                "get",
                "listJobs",
                "List jobs (oldest first, or by `order`), filtered by state, user, kind and array.",
                api.JobList,
                (*_READ, 422),
                ok_description="One page of jobs and how many match in all.",
                query=(
                    Param(
                        "state",
                        {"type": "string"},
                        "Comma-separated states, e.g. `queued,running`.",
                    ),
                    _USER,
                    Param("kind", {"$ref": "#/components/schemas/JobKind"}),
                    Param(
                        "array",
                        int_schema(0, api.MAX_ID),
                        "Only the jobs of this bulk submit or array (its `array_id`).",
                    ),
                    Param(
                        "order",
                        {"type": "string", "default": "id"},
                        "Sort column: `id`, `submitted_at`, `state`, `user`, `priority`, "
                        "`started_at` or `finished_at`; `-` in front for descending "
                        "(`-id`: the newest first).",
                    ),
                    *_PAGE,
                ),
            ),
            Op(
                "post",
                "submitJob",
                "Submit a job, an array of copies (`array`), or a list of jobs, as the caller.",
                (api.JobView, api.JobArray),
                _CREATE,
                ok=201,
                ok_description="Queued: the job, or every job of a bulk submit (`JobArray`).",
                body=(api.JobPost, api.JobPostList),
                location="the new job, `{base_url}gpusched/api/jobs/{id}`, or the jobs of a "
                "bulk submit, `{base_url}gpusched/api/jobs?array={array_id}`",
                description="The server sets `user`. A list of jobs is a bulk submit of at "
                f"most {api.MAX_ARRAY} jobs: all are queued or none is (more than 500 are "
                "written in chunks, held until the last is in). One job with `array: N` is "
                "kept as one record (`arrays/{array_id}`) whose tasks become jobs as the "
                "scheduler can place them; the answer holds task 0 and counts the rest as "
                "`pending`. Every task carries the labels `array_id` (task 0's job id) and "
                "`array_index` (0-based), also in its environment as `$GPUSCHED_ARRAY_ID` and "
                "`$GPUSCHED_ARRAY_INDEX`. Past the caller's per-user limits "
                "(`GpuSchedPolicy.limits`: queued jobs and leases, counting every job of a bulk "
                "submit and every pending task of an array; upload bytes; submissions per "
                "second) it answers 429 with `Retry-After`; a bulk submit or array larger "
                "than their `array_size`, 422.",
            ),
        ),
    ),
    Route(
        "/jobs/{job_id}",
        (
            Op(
                "get",
                "getJob",
                "One job; another user's without env values, parameters, handle or outputs.",
                api.JobView,
                (*_READ, 404),
            ),
            Op(
                "delete",
                "cancelJob",
                "Cancel a queued job or stop a running one (owner or admin).",
                api.JobView,
                (*_READ, 404, 409, 502),
                ok_description="The cancelled job.",
            ),
            Op(
                "patch",
                "updateJob",
                "Change a job's priority class or hold it (owner or admin).",
                api.JobView,
                (*_WRITE, 404, 409),
                ok_description="The changed job.",
                body=api.JobUpdate,
            ),
        ),
    ),
    Route(
        "/jobs/{job_id}/output",
        (
            Op(
                "get",
                "getJobOutput",
                "A notebook job's executed notebook or log, as a download (owner or admin).",
                "application/octet-stream",
                (*_READ, 404, 422),
                ok_description="The file's bytes (`Content-Disposition: attachment`).",
                query=(
                    Param(
                        "part",
                        {"type": "string", "enum": ["notebook", "log"], "default": "notebook"},
                    ),
                ),  # fmt: skip
            ),
        ),
    ),
    Route(
        "/jobs/{job_id}/log",
        (
            Op(
                "get",
                "readJobLog",
                "The job's combined stdout and stderr.",
                "text/plain",
                (*_READ, 404, 422, 429, 502),
                ok_description="Log bytes; `X-Log-Offset` is the offset of the next unread byte.",
                description="Without `follow`, answers the bytes from `offset` (at most `limit`) "
                "and the offset to ask for next in `X-Log-Offset`. With `follow=1` streams "
                "(chunked) until the job ends, or until the client goes; a user holds at most "
                "`GpuSchedApp.max_follows_per_user` follows at once, and follows count with "
                "the events websockets against the per-user `streams` limit.",
                query=(
                    Param("offset", int_schema(0, api.MAX_OFFSET, 0)),
                    Param("limit", int_schema(1, api.MAX_LOG_CHUNK, 65536)),
                    Param("follow", {"type": "string", "enum": ["0", "1", "true", "false"]}),
                ),
            ),
        ),
    ),
    Route(
        "/jobs/{job_id}/events",
        (
            Op(
                "get",
                "getJobEvents",
                "The job's timeline: state changes with their reasons, waiting reasons, stops.",
                api.JobEvents,
                (*_READ, 404),
                ok_description="Its events, oldest first (of a notebook's progress, the last); "
                "of another user's job, as the events websocket sends them: no progress, "
                "public details only.",
            ),
        ),
    ),
    Route(
        "/leases",
        (
            Op(
                "get",
                "listLeases",
                "The caller's live leases; admins may pass `user=all` or a name.",
                api.LeaseList,
                (*_READ, 422),
                ok_description="Queued, starting and running leases.",
                query=(Param("user", {"type": "string", "default": "me"}),),
            ),
        ),
    ),
    Route(
        "/arrays/{array_id}",
        (
            Op(
                "get",
                "getArray",
                "An `array: N` submit: its size, pending range, tasks by state, why it waits.",
                api.ArrayView,
                (*_READ, 404),
            ),
            Op(
                "delete",
                "cancelArray",
                "Cancel a whole array: its pending tasks at once and its live tasks' jobs "
                "(owner or admin).",
                api.ArrayCancelled,
                (*_READ, 404, 409, 502),
                ok_description="The array after, and what was cancelled.",
            ),
        ),
    ),
    Route(
        "/arrays/{array_id}/tasks/{index}",
        (
            Op(
                "get",
                "getArrayTask",
                "Task `index` of an array (`ID_7`): its job once made, or that it waits.",
                api.ArrayTask,
                (*_READ, 404),
            ),
            Op(
                "delete",
                "cancelArrayTask",
                "Cancel one task: a pending one never becomes a job (owner or admin).",
                api.ArrayTask,
                (*_READ, 404, 409, 502),
                ok_description="The task after.",
            ),
        ),
    ),
    Route(
        "/leases/{job_id}",
        (
            Op(
                "delete",
                "releaseLease",
                "Release a lease (cancel it); its remote kernel is shut down.",
                api.JobView,
                (*_READ, 404, 409, 502),
                ok_description="The released lease.",
            ),
        ),
    ),
    Route(
        "/leases/{job_id}/kernel",
        (
            Op(
                "get",
                "getLeaseKernel",
                "Connection to the lease's remote kernel, forwarded to this server's loopback.",
                api.LeaseKernel,
                (*_READ, 404, 409, 502),
                description="Only the lease's owner (or an admin) may read it; reading counts "
                "as activity on the lease, postponing its idle reclaim. `generation` grows each "
                "time the ports had to be forwarded again (after a dropped SSH connection): "
                "clients reconnect when it changes.",
            ),
        ),
    ),
    Route(
        "/cluster",
        (
            Op(
                "get",
                "getCluster",
                "Nodes and GPUs with their state and holders, fragmentation figures, the window.",
                api.Cluster,
                _READ,
            ),
        ),
    ),
    Route(
        "/cluster/history",
        (
            Op(
                "get",
                "getGpuHistory",
                "GPUs' utilization, memory and power over time (kept in memory, bounded).",
                api.GpuHistory,
                (*_READ, 404, 422),
                ok_description="One series per GPU, samples as columns.",
                description="Samples are taken at every probe of the nodes "
                "(`inventory_interval_s`); each GPU keeps the last `kept_samples`. With `job`, "
                "only the GPUs that job held and the samples taken while it held them. Longer "
                "ranges are merged into at most `points` samples (mean utilization and power, "
                "peak memory).",
                query=(
                    Param("node", {"type": "string"}, "Only this node's GPUs."),
                    Param("gpu", {"type": "string"}, "Comma-separated GPU indices, e.g. `0,1`."),
                    Param("job", int_schema(1, api.MAX_ID), "Only while this job held them."),
                    Param("since", {"type": "string"}, "ISO 8601 time with a timezone."),
                    Param("until", {"type": "string"}, "ISO 8601 time with a timezone."),
                    Param("points", int_schema(2, 2000, 500), "Most samples per series."),
                ),
            ),
        ),
    ),
    Route(
        "/policy",
        (
            Op(
                "get",
                "getPolicy",
                "The policy window in force at `at` (default now), the per-user limits "
                "(the caller's too), explained in words.",
                api.PolicyView,
                (*_READ, 422),
                query=(
                    Param(
                        "at",
                        {"type": "string"},
                        "ISO 8601 time with a timezone, e.g. `2026-11-23T22:00:00+01:00`.",
                    ),
                ),
            ),
        ),
    ),
    Route(
        "/openapi.yaml",
        (
            Op(
                "get",
                "getOpenApi",
                "This file.",
                "application/yaml",
                (401, 403),
                ok_description="The OpenAPI description of this API.",
            ),
        ),
    ),
    Route(
        "/notebooks",
        (
            Op(
                "post",
                "submitNotebook",
                "Run a notebook as a batch job now, later, or on a cron schedule.",
                api.NotebookSubmitted,
                (*_CREATE, 404),
                ok=201,
                ok_description="Queued (`job`) or scheduled (`definition`).",
                body=api.NotebookSubmission,
                location="the new job or definition",
                description="`at` is `now`, `tonight` (the next policy window that lets batch "
                "jobs run without a time limit; `night` is a synonym), a window name, an ISO "
                "time (naive = `timezone`), or a cron expression such as `0 2 * * *`, which "
                "stores a recurring definition instead of a job. The notebook path is relative "
                "to the server's root directory (or absolute inside it). The executed notebook "
                "and its log come back beside the input as `<stem>-<UTC start>-job<id>.ipynb` / "
                "`.log` (the job's `outputs`, which only the server sets).",
            ),
        ),
    ),
    Route(
        "/definitions",
        (
            Op(
                "get",
                "listDefinitions",
                "List recurring job definitions (oldest first).",
                api.DefinitionList,
                (*_READ, 422),
                ok_description="One page of definitions and how many match in all.",
                query=(_USER, *_PAGE),
            ),
            Op(
                "post",
                "createDefinition",
                "Store a recurring notebook job (cron `schedule`, or a cron `at`, in `timezone`).",
                api.Definition,
                (*_CREATE, 404),
                ok=201,
                ok_description="Stored.",
                body=api.NotebookSubmission,
                location="the new definition",
            ),
        ),
    ),
    Route(
        "/definitions/{definition_id}",
        (
            Op(
                "get",
                "getDefinition",
                "One definition with its latest firings.",
                api.Definition,
                (*_READ, 404),
            ),
            Op(
                "patch",
                "updateDefinition",
                "Pause, resume or reschedule a definition (owner or admin).",
                api.Definition,
                (*_WRITE, 404),
                ok_description="The changed definition.",
                body=api.DefinitionUpdate,
            ),
            Op(
                "delete",
                "deleteDefinition",
                "Delete a definition (owner or admin); jobs it made stay.",
                api.Definition,
                (*_READ, 404),
                ok_description="The deleted definition.",
            ),
        ),
    ),
)
