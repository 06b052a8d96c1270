"""Fuzz every route of the shipped OpenAPI file against a live server (schemathesis).

Checks: no 5xx, every status documented, every body (errors included) and header as the spec
says. Bounded: a few dozen examples per generation mode.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

pytestmark = pytest.mark.slow

SPEC_PATH = Path(str(resources.files("jupyter_gpusched.server").joinpath("openapi.yaml")))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
MAX_EXAMPLES = 15  # per route and mode: about 500 requests in all


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from _fixtures_server import ServerProcess

    server = ServerProcess(tmp_path_factory.mktemp("fuzz")).start()
    yield server
    server.stop()


def _defuse(case: Any) -> None:
    """Generated jobs run for real on the simulated nodes: make them run `true`, nothing else.

    Arrays and lists of jobs are cut to three jobs. Also never follow a log (it streams until
    the job ends, which a queued job never does).
    """
    body = case.body
    if isinstance(body, list):  # a bulk submit: a few jobs are enough to fuzz it
        del body[3:]
    for item in body if isinstance(body, list) else [body]:
        if isinstance(item, dict) and item.get("command") is not None:
            item["command"] = ["true"]
            for key in ("env", "files", "workdir"):
                item.pop(key, None)
        if isinstance(item, dict) and isinstance(item.get("array"), int):
            item["array"] = min(item["array"], 3)
    if isinstance(case.query, dict):
        case.query.pop("follow", None)


SCHEMA = schemathesis.openapi.from_path(SPEC_PATH)
OPERATIONS = {r.ok().label: r.ok() for r in SCHEMA.get_all_operations()}


@pytest.mark.parametrize(
    "mode",
    [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE],
    ids=["valid", "invalid"],
)
@pytest.mark.parametrize("label", list(OPERATIONS))
def test_every_route_answers_as_documented(fuzz_server: Any, label: str, mode: Any) -> None:
    auth = {"Authorization": f"token {fuzz_server.token}"}
    strategy = OPERATIONS[label].as_strategy(generation_mode=mode)

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def check(case: Any) -> None:
        _defuse(case)
        response = case.call(base_url=fuzz_server.url.rstrip("/"), headers=auth, timeout=30)
        case.validate_response(response, checks=CHECKS, headers=auth)

    check()


def test_unauthenticated_calls_are_401_on_every_route(fuzz_server: Any) -> None:
    seen = []
    for operation in OPERATIONS.values():
        params = {name: 1 for name in re.findall(r"{(\w+)}", operation.path)}
        body = {} if operation.method in ("post", "patch", "put") else schemathesis.core.NOT_SET
        case = operation.Case(path_parameters=params, body=body)
        response = case.call(base_url=fuzz_server.url.rstrip("/"), timeout=30)
        assert response.status_code == 401, (operation.label, response.text)
        case.validate_response(response, checks=CHECKS)
        seen.append(operation.label)
    assert "GET /gpusched/api/jobs" in seen and len(seen) >= 11
