"""The OpenAPI file, generated from the API's models and a route table.

The bodies' schemas come from :mod:`jupyter_gpusched.core.api` (and the job spec of
:mod:`jupyter_gpusched.core.models`); the paths, methods, status codes and query arguments
come from :data:`ROUTES` below. Regenerate the shipped file after changing either::

    python -m jupyter_gpusched.server.openapi > jupyter_gpusched/server/openapi.yaml

(``make openapi``); a test fails while the committed file is stale. Imports neither tornado
nor jupyter_server, so the lab extension's build can run it too.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, models_json_schema

from jupyter_gpusched import __version__
from jupyter_gpusched.core import api
from jupyter_gpusched.core.models import JobSubmission

#: The command that writes the shipped file (tests name it when the file is stale).
REGENERATE = "python -m jupyter_gpusched.server.openapi > jupyter_gpusched/server/openapi.yaml"
PREFIX = "/gpusched/api"

DESCRIPTION = """\
Every path is relative to the Jupyter server's base URL. Authenticate like any Jupyter API
call: `Authorization: token <TOKEN>` (see `jupyter server list`) or the browser's cookie.

Errors always answer a JSON body `Error`: 400 unreadable body, 401 no credentials, 403 not
yours / not allowed, 404 no such job, 409 the job's state forbids it, 422 a field is invalid
or the job can never fit; 502 only when a node cannot be reached; 503 while the scheduler
starts.

Events: a websocket at `gpusched/api/events?after=<event id>` sends one JSON message per
event (schema `Event`, with the event's job); with `after` it first replays stored events
newer than that id, so a client resumes after a reconnect (`after=-1`: only new events).
After changes, at most once a second, a `cluster` message (id null) carries the `Cluster`.

Generated from the pydantic models in jupyter_gpusched/core/api.py by
`python -m jupyter_gpusched.server.openapi`; do not edit by hand.
"""

#: Error status -> (shared response name, when it happens).
ERRORS: dict[int, tuple[str, str]] = {
    400: ("BadRequest", "The body could not be read (not JSON)."),
    401: ("Unauthorized", "No valid token or cookie."),
    403: ("Forbidden", "Not the job's owner nor an admin, or not authorized for this resource."),
    404: ("NotFound", "No such job, lease or definition (or not a lease)."),
    409: ("Conflict", "The job's state forbids the change (e.g. it already finished)."),
    422: ("Invalid", "A field or query argument is invalid, or the job can never fit."),
    502: ("Unreachable", "A node could not be reached."),
    503: ("Unavailable", "The scheduler has not started (yet)."),
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
    response: type[BaseModel] | str  # a model (JSON), or a media type answering text
    errors: tuple[int, ...]
    ok: int = 200
    ok_description: str = "OK."
    body: type[BaseModel] | None = None
    query: tuple[Param, ...] = ()
    description: str | None = None
    location: str | None = None  # 201: what the Location header names


@dataclass(frozen=True)
class Route:
    """A path under ``PREFIX`` (``{name}`` marks an id in the path) and its methods."""

    path: str
    ops: tuple[Op, ...]


def _int(lo: int, hi: int | None = None, default: int | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", "minimum": lo}
    if hi is not None:
        schema["maximum"] = hi
    if default is not None:
        schema["default"] = default
    return schema


_USER = Param("user", {"type": "string"}, "Owner's name, or `me` for the caller.")
_PAGE = (
    Param("limit", _int(0, api.MAX_LIMIT, 100)),
    Param("offset", _int(0, api.MAX_OFFSET, 0)),
)
_READ, _WRITE = (401, 403, 503), (400, 401, 403, 422, 503)

ROUTES: tuple[Route, ...] = (
    Route(
        "/jobs",
        (
            Op(
                "get",
                "listJobs",
                "List jobs (oldest first), filtered by state, user and kind.",
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
                    *_PAGE,
                ),
            ),
            Op(
                "post",
                "submitJob",
                "Submit a job as the caller (the server sets `user`).",
                api.JobView,
                _WRITE,
                ok=201,
                ok_description="Queued.",
                body=JobSubmission,
                location="the new job, `{base_url}gpusched/api/jobs/{id}`",
            ),
        ),
    ),
    Route(
        "/jobs/{job_id}",
        (
            Op("get", "getJob", "One job.", api.JobView, (*_READ, 404)),
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
        "/jobs/{job_id}/log",
        (
            Op(
                "get",
                "readJobLog",
                "The job's combined stdout and stderr.",
                "text/plain",
                (*_READ, 404, 422, 502),
                ok_description="Log bytes; `X-Log-Offset` is the offset of the next unread byte.",
                description="Without `follow`, answers the bytes from `offset` (at most `limit`) "
                "and the offset to ask for next in `X-Log-Offset`. With `follow=1` streams "
                "(chunked) until the job ends.",
                query=(
                    Param("offset", _int(0, api.MAX_OFFSET, 0)),
                    Param("limit", _int(1, api.MAX_LOG_CHUNK, 65536)),
                    Param("follow", {"type": "string", "enum": ["0", "1", "true", "false"]}),
                ),
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
        "/policy",
        (
            Op(
                "get",
                "getPolicy",
                "The policy window in force at `at` (default now), explained in words.",
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
                (*_WRITE, 404),
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
                "`.log` (labels `output_notebook`, `output_log`).",
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
                (*_WRITE, 404),
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


class _Schemas(GenerateJsonSchema):
    """Pydantic's JSON schema without a title on every field (the names say it)."""

    def field_title_should_be_set(self, schema: Any) -> bool:  # noqa: D102
        return False


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{_name(model)}"}


def _name(model: type[BaseModel]) -> str:
    return str(model.model_config.get("title") or model.__name__)


def _models() -> Iterator[tuple[type[BaseModel], JsonSchemaMode]]:
    """Every model the API uses: requests as validated, responses as serialized."""
    for route in ROUTES:
        for op in route.ops:
            if op.body is not None:
                yield op.body, "validation"
            if not isinstance(op.response, str):
                yield op.response, "serialization"
    yield api.Error, "serialization"
    for model in EXTRA_MODELS:
        yield model, "serialization"


def schemas() -> dict[str, Any]:
    """``components.schemas``: the models' JSON schemas under their API names."""
    models = list(dict.fromkeys(_models()))
    _, top = models_json_schema(
        models, ref_template="#/components/schemas/{model}", schema_generator=_Schemas
    )
    defs: dict[str, Any] = top["$defs"]
    renames = {m.__name__: _name(m) for m, _ in models if _name(m) != m.__name__}
    clash = [f"{a} vs {b}" for a, b in renames.items() if b in defs]
    if any(name.endswith(("-Input", "-Output")) for name in defs) or clash:
        raise ValueError(f"a model's request and response schemas differ, or names clash: {clash}")
    out = {renames.get(k, k): _tidy(v, renames) for k, v in sorted(defs.items())}
    return dict(sorted(out.items()))


def _tidy(node: Any, renames: dict[str, str]) -> Any:
    """Apply API names to references, and drop ``default: null`` where null is not allowed."""
    if isinstance(node, list):
        return [_tidy(x, renames) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _tidy(v, renames) for k, v in node.items()}
    ref = out.get("$ref")
    if isinstance(ref, str):
        name = ref.rsplit("/", 1)[1]
        out["$ref"] = ref[: -len(name)] + renames.get(name, name)
    if "default" in out and out["default"] is None and not _nullable(out):
        del out["default"]
    return out


def _nullable(schema: dict[str, Any]) -> bool:
    return any(s.get("type") == "null" for s in schema.get("anyOf", ())) or schema.get("type") in (
        "null",
        ["null"],
    )


def _operation(route: Route, op: Op) -> dict[str, Any]:
    out: dict[str, Any] = {"operationId": op.operation_id, "summary": op.summary}
    if op.description:
        out["description"] = op.description
    if op.query:
        out["parameters"] = [
            {
                "name": p.name,
                "in": "query",
                **({"description": p.description} if p.description else {}),
                "schema": p.schema,
            }
            for p in op.query
        ]
    if op.body is not None:
        content = {"application/json": {"schema": _ref(op.body)}}
        out["requestBody"] = {"required": True, "content": content}
    ok: dict[str, Any] = {"description": op.ok_description}
    if isinstance(op.response, str):
        # clients read YAML into an object, and text as a string
        kind = "object" if op.response.endswith("yaml") else "string"
        ok["content"] = {op.response: {"schema": {"type": kind}}}
        if op.operation_id == "readJobLog":
            ok["headers"] = {
                "X-Log-Offset": {
                    "description": "Offset of the next unread byte.",
                    "schema": {"type": "string"},
                }
            }
    else:
        ok["content"] = {"application/json": {"schema": _ref(op.response)}}
    if op.location:
        ok["headers"] = {
            "Location": {"description": f"Path of {op.location}.", "schema": {"type": "string"}}
        }
    responses: dict[str, Any] = {str(op.ok): ok}
    for status in sorted(op.errors):
        responses[str(status)] = {"$ref": f"#/components/responses/{ERRORS[status][0]}"}
    out["responses"] = responses
    return out


def _path_params(path: str) -> list[dict[str, Any]]:
    names = [part[1:-1] for part in path.split("/") if part.startswith("{")]
    return [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": _int(0, api.MAX_ID),
        }
        for name in names
    ]


def document() -> dict[str, Any]:
    """The whole OpenAPI document."""
    paths: dict[str, Any] = {}
    for route in ROUTES:
        item: dict[str, Any] = {}
        if params := _path_params(route.path):
            item["parameters"] = params
        for op in route.ops:
            item[op.method] = _operation(route, op)
        paths[PREFIX + route.path] = item
    error = {"application/json": {"schema": _ref(api.Error)}}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "jupyter-gpusched",
            "version": __version__,
            "summary": "One GPU-cluster queue, served by a Jupyter server extension.",
            "description": DESCRIPTION,
            "license": {"name": "BSD-3-Clause"},
        },
        "servers": [{"url": "/"}],
        "security": [{"token": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {
                "token": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "Authorization",
                    "description": "`token <TOKEN>`, the Jupyter server's token.",
                }
            },
            "responses": {
                name: {"description": text, "content": error} for name, text in ERRORS.values()
            },
            "schemas": schemas(),
        },
    }


class _Dumper(yaml.SafeDumper):
    """Multi-line text as literal blocks, so the file reads like the hand-written one did."""


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _str)


def render() -> str:
    """The OpenAPI file's text."""
    header = f"# Generated by `{REGENERATE}`; do not edit.\n"
    body = yaml.dump(document(), Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
    return header + body


def main() -> int:
    """Print the OpenAPI file."""
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
