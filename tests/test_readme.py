"""The README's configuration example stays valid as the traits evolve."""

from __future__ import annotations

import re
from pathlib import Path

from traitlets.config import Config

from jupyter_gpusched.server.app import GpuSchedApp
from jupyter_gpusched.server.config import GpuSchedPolicy

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_config_example_loads_into_the_traits() -> None:
    code = re.search(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert code is not None
    c = Config()
    exec(code.group(1), {"c": c})  # noqa: S102 - our own README
    policy = GpuSchedPolicy(config=c).to_policy_config()
    assert policy.timezone == "Europe/Berlin"
    assert [w.name for w in policy.windows] == ["day", "night"]
    assert policy.windows[0].batch_max_runtime_s == 4 * 3600
    app = GpuSchedApp(config=c)
    assert [n["name"] for n in app.nodes] == ["gpu1", "gpu2"]
    assert app.admin_users == {"lab-admin"}
