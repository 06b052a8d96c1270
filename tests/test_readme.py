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


def _lab_wide_blocks() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## A lab-wide queue", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_readme_jupyterhub_config_loads_into_jupyterhub() -> None:
    from jupyterhub.app import JupyterHub
    from jupyterhub.spawner import Spawner

    from jupyter_gpusched.server.auth import ADMIN_SCOPE

    c = Config()
    exec(_lab_wide_blocks()[0], {"c": c})  # noqa: S102 - our own README
    hub = JupyterHub(config=c)
    (service,) = hub.services
    assert service["name"] == "gpusched" and service["command"][:3] == [
        "jupyter",
        "gpusched",
        "service",
    ]
    assert ADMIN_SCOPE in hub.custom_scopes
    roles = {r["name"]: r for r in hub.load_roles}
    assert "access:services!service=gpusched" in roles["user"]["scopes"]
    assert roles["gpusched-admin"]["scopes"] == [ADMIN_SCOPE]
    scopes = Spawner(config=c).server_token_scopes
    assert {"access:services!service=gpusched", "read:services!service=gpusched"} <= set(scopes)


def test_the_readme_service_and_client_configs_load_into_the_traits() -> None:
    service_block, client_block = _lab_wide_blocks()[1:3]
    c = Config()
    exec(service_block, {"c": c})  # noqa: S102 - our own README
    app = GpuSchedApp(config=c)
    assert app.store_url.startswith("postgresql+psycopg://")
    assert [n["name"] for n in app.nodes] == ["gpu1"]
    assert GpuSchedPolicy(config=c).to_policy_config().timezone == "Europe/Berlin"
    c = Config()
    exec(client_block, {"c": c})  # noqa: S102 - our own README
    client = GpuSchedApp(config=c)
    assert client.service_url == "http://gpu-head:10101/" and client.service_token.startswith(
        "gsk_"
    )


def test_the_readme_limits_config_loads_and_its_table_gives_the_service_defaults() -> None:
    from jupyter_gpusched.core.limits import SERVICE_LIMITS, format_value

    block = _lab_wide_blocks()[3]
    c = Config()
    exec(block, {"c": c})  # noqa: S102 - our own README
    limits = GpuSchedPolicy(config=c).to_policy_config(service=True).limits
    assert (limits.everyone.queued_jobs, limits.everyone.upload_bytes) == (2000, 4 << 30)
    assert limits.for_user("bob").limits.running_jobs == 1000  # in nlp by user_groups
    assert limits.for_user("carol", admin=True).limits.submits_per_s is None
    assert limits.for_user("alice").limits.queued_jobs == 50_000
    section = README.read_text(encoding="utf-8").split("## A lab-wide queue", 1)[1]
    for key in ("queued_jobs", "running_jobs", "array_size", "leases", "streams"):
        assert f"| `{key}` | {format_value(key, getattr(SERVICE_LIMITS, key))} |" in section
    assert "| `upload_bytes` | 2G |" in section
    assert f"| `submits_per_s`, `submit_burst` | {SERVICE_LIMITS.submits_per_s:g}, " in section


def test_the_readme_slurm_config_selects_and_configures_the_slurm_backend() -> None:
    from jupyter_gpusched.cluster.slurm import SlurmBackend
    from jupyter_gpusched.core.clock import SystemClock

    text = README.read_text(encoding="utf-8")
    section = text.split("## Using an existing Slurm cluster", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, re.S)
    c = Config()
    exec(block, {"c": c})  # noqa: S102 - our own README
    app = GpuSchedApp(config=c)
    assert app.backend_class is SlurmBackend
    backend = SlurmBackend(clock=SystemClock(), config=c)
    assert (backend.partition, backend.run_as) == ("gpu", "owner")
    assert backend.gpu_mem_gb == {"a100": 80.0, "v100": 32.0}
    assert backend.sbatch_args == ["--account=lab"]


def test_the_readme_run_as_owner_config_loads_into_the_traits_and_node_configs() -> None:
    from jupyter_gpusched.cluster.ssh import NodeConfig
    from jupyter_gpusched.server.building import node_kwargs

    text = README.read_text(encoding="utf-8")
    section = text.split("## Jobs run as their owners", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, re.S)
    c = Config()
    exec(block, {"c": c})  # noqa: S102 - our own README
    app = GpuSchedApp(config=c)
    assert (app.run_as, app.user_key_file) == ("sudo", "/etc/gpusched/keys/{user}")
    (node,) = (NodeConfig(**node_kwargs(n, app)) for n in app.nodes)
    assert node.agent_argv() == ("/opt/gpusched/bin/gpusched-agent",)
    assert (node.run_as, node.username, node.key_file_of("alice")) == (
        "sudo",
        "gpusched",
        "/etc/gpusched/keys/alice",
    )
    # the sudoers line the section documents is the one the tests install
    from _fixtures_owners import sudoers_line

    line = sudoers_line("gpusched", "/opt/gpusched/bin/gpusched-agent", "gpu-users").strip()
    assert line in section
