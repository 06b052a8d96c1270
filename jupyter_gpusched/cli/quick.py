"""A plain ``jupyter gpusched queue``, answered without building the traitlets application.

``queue`` is typed as often as ``squeue``, and most of its time was imports: jupyter_core's
application, traitlets, asyncio, and pydantic building the API's models (~410 of 480 ms with
3,000 queued jobs, where the server answered in 11 ms). Here a ``queue`` whose every word is
one of its own options (:data:`~jupyter_gpusched.client.options.QUEUE_OPTIONS` and
:data:`~jupyter_gpusched.client.options.SERVER_OPTIONS`, the table ``QueueApp`` reads too),
with no config file that could change them, is answered with the standard library: the same
discovery and request as every client (:mod:`jupyter_gpusched.client.rest`), the same table
writer (:mod:`.queue_text`) fed the server's JSON as it came. Anything else -- ``--help``, a
misspelt or unknown option, a bad value, ``--Class.trait=``, a config file -- returns None and
the full application runs, with its messages and exit codes as they are.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from jupyter_gpusched.client.options import (
    QUEUE_LIMIT,
    QUEUE_OPTIONS,
    QUEUE_STATES,
    SERVER_OPTIONS,
)

PROG = "jupyter gpusched queue"
#: The config files a ``jupyter gpusched`` command reads (``JupyterApp.load_config_file``).
CONFIG_FILES = (
    "jupyter_config.py",
    "jupyter_config.json",
    "jupyter_gpusched_config.py",
    "jupyter_gpusched_config.json",
)


def quick_queue(argv: list[str]) -> int | None:
    """Run ``argv`` (``queue [OPTIONS]``) here and return its exit status; None: not ours."""
    if not argv or argv[0] != "queue":
        return None
    values = read_options(argv[1:])
    if values is None or config_files():
        return None
    from jupyter_gpusched.client.rest import RestClient, find_server
    from jupyter_gpusched.core.errors import GpuSchedError

    query = {
        "state": values.get("state") or (None if values.get("all") else QUEUE_STATES),
        "user": values.get("user") or None,
        "array": values.get("array"),
        "limit": values.get("limit", QUEUE_LIMIT),
        "offset": 0,
    }
    try:
        info = find_server(values.get("url") or None, values.get("token") or None)
        page = RestClient(info.url, info.token).get_json("jobs", query)
        print(_json(page) if values.get("json") else _table(page))
    except GpuSchedError as exc:
        print(f"{PROG}: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def read_options(words: list[str]) -> dict[str, Any] | None:
    """The values of ``words`` by option name, read as ``QueueApp`` reads them; None: not plain.

    ``--limit 5`` and ``--limit=5``; a repeated option's last value counts, as in traitlets.
    A word of another shape, an option of no table here, or a value the option refuses is the
    full application's to explain.
    """
    table = {**QUEUE_OPTIONS, **SERVER_OPTIONS}
    values: dict[str, Any] = {}
    i = 0
    while i < len(words):
        flag, eq, text = words[i].partition("=")
        option = table.get(flag)
        if option is None:
            return None
        if option.kind == "flag":
            if eq:
                return None
            values[option.name] = True
        else:
            if not eq:
                i += 1
                if i == len(words) or words[i].startswith("-"):
                    return None
                text = words[i]
            try:
                values[option.name] = option.parse(text)
            except ValueError:
                return None
        i += 1
    return values


def config_files() -> list[str]:
    """The config files a ``jupyter gpusched`` command would read here (none: nothing to apply)."""
    from jupyter_core.paths import jupyter_config_dir, jupyter_config_path

    dirs = [jupyter_config_dir(), *jupyter_config_path()]
    return [
        path
        for d in dict.fromkeys(dirs)
        for name in CONFIG_FILES
        if os.path.isfile(path := os.path.join(d, name))
    ]


def _table(page: dict[str, Any]) -> str:
    from .queue_text import queue_text

    return queue_text(page["jobs"], total=page.get("total"), arrays=page.get("arrays"))


def _json(page: dict[str, Any]) -> str:
    import json

    return json.dumps(page, indent=2, ensure_ascii=False)
