"""Steps the lab's playwright tests share: API calls, toasts, a GPU kernel starting.

``page_call`` calls the API from the page, as the panel does (the page's login and token);
``api_call`` calls it with the server's token from the test process.
"""

from __future__ import annotations

import json
import re
import sys
import urllib.request
from typing import Any

from _fixtures_lab import SIM_NODES, LabServer
from _fixtures_polling import scaled_ms, wait_for


def page_call(page: Any, server: LabServer, method: str, path: str, body: Any = None) -> Any:
    """One API call from the page, as the panel makes them (the page's login and token)."""
    return page.evaluate(
        """async ([url, token, method, body]) => {
            const r = await fetch(url, {
                method,
                headers: {Authorization: `token ${token}`, 'Content-Type': 'application/json'},
                body: body === null ? undefined : JSON.stringify(body)
            });
            const text = await r.text();
            if (!r.ok) { throw new Error(`${method} ${url}: ${r.status} ${text}`); }
            return text ? JSON.parse(text) : null;
        }""",
        [server.url + path, server.token, method, body],
    )


def api_call(server: LabServer, method: str, path: str, body: Any = None) -> Any:
    """``METHOD gpusched/api/PATH`` with the server's token; the answer's JSON."""
    req = urllib.request.Request(
        server.url + "gpusched/api/" + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"token {server.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def announced_job(page: Any) -> int:
    """The id of the job the last "Submitted … as GPU job #N" toast announced."""
    toast = page.locator(".Toastify__toast", has_text="as GPU job #").last
    toast.wait_for(state="visible")
    match = re.search(r"GPU job #(\d+)", toast.inner_text())
    assert match, toast.inner_text()
    return int(match.group(1))


def starting_kernel(page: Any) -> None:
    """Until the notebook is starting its GPU kernel (the status bar says "Initializing")."""
    page.locator(".jp-StatusBar-Widget", has_text="Python 3 (1 GPU) | Initializing").wait_for(
        timeout=scaled_ms(60)
    )


def kernel_leases(server: LabServer, notebook: str) -> list[dict[str, Any]]:
    """The GPU-kernel leases of ``notebook`` (a path under the lab's root)."""
    jobs = server.api("gpusched/api/jobs?kind=lease&limit=1000")["jobs"]
    return [j for j in jobs if j["spec"]["labels"].get("gpusched.notebook") == notebook]


def block_every_gpu(server: LabServer) -> list[dict[str, Any]]:
    """Sleeping jobs that take each node of the simulated lab whole (8, 8, 4 and 2 GPUs).

    Returns once all of them run: a GPU an earlier lease was still giving back would
    otherwise go to the next lease, which would then never wait.
    """
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    spec = {"kind": "script", "command": sleep, "max_runtime_s": 600}
    jobs = [api_call(server, "POST", "jobs", {**spec, "gpus": n}) for n in SIM_NODES.values()]
    for job in jobs:
        wait_for(
            lambda job=job: api_call(server, "GET", f"jobs/{job['id']}")["state"],
            lambda state: state == "running",
            timeout_s=60,
            what=lambda state, job=job: f"blocker {job['id']} to run (now {state})",
        )
    return jobs


def cancel_all(server: LabServer, jobs: list[dict[str, Any]]) -> None:
    for job in jobs:
        api_call(server, "DELETE", f"jobs/{job['id']}")
