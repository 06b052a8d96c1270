"""The shipped OpenAPI file is generated from the API's models and matches the routes served."""

from __future__ import annotations

import re
from importlib import resources

from tornado.web import RequestHandler

from jupyter_gpusched.server.openapi import REGENERATE, render
from jupyter_gpusched.server.routes import PREFIX

METHODS = ("get", "post", "put", "patch", "delete")


def test_the_committed_openapi_file_is_generated_from_the_models() -> None:
    shipped = resources.files("jupyter_gpusched.server").joinpath("openapi.yaml").read_text()
    assert shipped == render(), f"openapi.yaml is stale; regenerate it: make openapi ({REGENERATE})"


def test_every_served_route_and_method_is_documented_and_nothing_else() -> None:
    import yaml

    from jupyter_gpusched.server.handlers import arrays, cluster, jobs, leases, notebooks

    served = set()
    for module in (jobs, arrays, cluster, leases, notebooks):
        for pattern, handler in module.handlers:
            path = "/" + re.sub(r"\(\[\^/\]\+\)", "{id}", pattern)
            for method in METHODS:
                if getattr(handler, method) is not getattr(RequestHandler, method):
                    served.add((method, path))
    spec = yaml.safe_load(render())
    documented = {
        (method, re.sub(r"{\w+}", "{id}", path))
        for path, item in spec["paths"].items()
        for method in item
        if method in METHODS
    }
    assert all(path.startswith(PREFIX) for _, path in documented)
    assert served == documented
