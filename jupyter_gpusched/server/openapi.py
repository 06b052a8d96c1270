"""The OpenAPI file, generated from the API's models and a route table.

The bodies' schemas come from :mod:`jupyter_gpusched.core.api` (and the job spec of
:mod:`jupyter_gpusched.core.models`); the paths, methods, status codes and query arguments
come from the table in :mod:`.routes`. Regenerate the shipped file after changing either::

    python -m jupyter_gpusched.server.openapi > jupyter_gpusched/server/openapi.yaml

(``make openapi``); a test fails while the committed file is stale. Imports neither tornado
nor jupyter_server, so the lab extension's build can run it too.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, models_json_schema

from jupyter_gpusched import __version__
from jupyter_gpusched.core import api

from .routes import ERRORS, EXTRA_MODELS, PREFIX, ROUTES, Op, Route, int_schema

#: The command that writes the shipped file (tests name it when the file is stale).
REGENERATE = "python -m jupyter_gpusched.server.openapi > jupyter_gpusched/server/openapi.yaml"

DESCRIPTION = """\
Every path is relative to the Jupyter server's base URL. Authenticate like any Jupyter API
call: `Authorization: token <TOKEN>` (see `jupyter server list`) or the browser's cookie.

Errors always answer a JSON body `Error`: 400 unreadable body, 401 no credentials, 403 not
yours / not allowed, 404 no such job, 409 the job's state forbids it, 413 the body is larger
than the server reads, 422 a field is invalid (too large included: the message says the
limit) or the job can never fit, 429 (with `Retry-After`) over one of the caller's per-user
limits, naming it and the caller's count; 502 only when a node cannot be reached; 503 (with
`Retry-After`) while the scheduler starts or its store is away.

Creates (`POST` of jobs, notebooks, definitions) take an `Idempotency-Key` header (the IETF
httpapi draft's): a unique string per create, e.g. a UUID, sent again with a repeat of that
request after a lost answer. The server keeps it with what it made, for the caller, a day
(`GpuSchedApp.idempotency_keep_s`): a repeat answers the first request's status, `Location`
and the thing it made as it is now, with `Idempotent-Replayed: true`, and makes nothing twice,
across restarts and a standby taking over. The key with another route or body answers 422;
a repeat while the first is still answered 409 with `Retry-After`; a malformed key 400.

Events: a websocket at `gpusched/api/events?after=<event id>` sends one JSON message per
event (schema `Event`, with the event's job); with `after` it first replays stored events
newer than that id, so a client resumes after a reconnect (`after=-1`: only new events).
Past the caller's `streams` limit the upgrade is refused with 429 (an `Error` body).
After changes, at most once a second, a `cluster` message (id null) carries the `Cluster`.

Generated from the pydantic models in jupyter_gpusched/core/api.py by
`python -m jupyter_gpusched.server.openapi`; do not edit by hand.
"""


#: The header parameter of every create (:mod:`.idempotency`).
KEY_PARAMETER: dict[str, Any] = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "A unique key for this create, sent again with its repeats: 1 to 255 "
    'printable ASCII characters, as a structured-field string (`"..."`) or bare. A repeat '
    "gets the first request's answer instead of a second job.",
    "schema": {"type": "string", "minLength": 1, "maxLength": 257},
}


class _Schemas(GenerateJsonSchema):
    """Pydantic's JSON schema without a title on every field (the names say it)."""

    def field_title_should_be_set(self, schema: Any) -> bool:  # noqa: D102
        return False


def _ref(model: type[BaseModel] | tuple[type[BaseModel], ...]) -> dict[str, Any]:
    if isinstance(model, tuple):
        return {"oneOf": [_ref(m) for m in model]}
    return {"$ref": f"#/components/schemas/{_name(model)}"}


def _each(
    model: type[BaseModel] | tuple[type[BaseModel], ...] | str | None,
) -> tuple[type[BaseModel], ...]:
    """The models of a body or response: none for text, several for a choice."""
    if model is None or isinstance(model, str):
        return ()
    return model if isinstance(model, tuple) else (model,)


def _name(model: type[BaseModel]) -> str:
    return str(model.model_config.get("title") or model.__name__)


def _models() -> Iterator[tuple[type[BaseModel], JsonSchemaMode]]:
    """Every model the API uses: requests as validated, responses as serialized."""
    for route in ROUTES:
        for op in route.ops:
            for body in _each(op.body):
                yield body, "validation"
            for response in _each(op.response):
                yield response, "serialization"
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
    if op.location:  # a create: it takes a key
        out.setdefault("parameters", []).append(KEY_PARAMETER)
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
            "Location": {"description": f"Path of {op.location}.", "schema": {"type": "string"}},
            "Idempotent-Replayed": {
                "description": "`true` when this answers a repeat of an earlier request with "
                "the same `Idempotency-Key` (nothing new was made).",
                "schema": {"type": "string", "enum": ["true"]},
            },
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
            "schema": int_schema(0, api.MAX_ID),
        }
        for name in names
    ]


def _error(name: str, text: str, content: dict[str, Any]) -> dict[str, Any]:
    """A shared error response; 409, 429 and 503 say when to try again."""
    out: dict[str, Any] = {"description": text, "content": content}
    if name in (ERRORS[409][0], ERRORS[429][0], ERRORS[503][0]):
        out["headers"] = {
            "Retry-After": {
                "description": "Seconds to wait before trying again.",
                "schema": {"type": "string"},
            }
        }
    return out


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
            "responses": {name: _error(name, text, error) for name, text in ERRORS.values()},
            "schemas": schemas(),
        },
    }


class _Dumper(yaml.SafeDumper):
    """Multi-line text as literal blocks, and no YAML anchors for schemas used twice."""

    def ignore_aliases(self, data: Any) -> bool:  # noqa: D102
        return True


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
