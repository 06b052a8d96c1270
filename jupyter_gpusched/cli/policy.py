"""``jupyter gpusched policy --at "2026-11-23 09:00"``: which policy rules hold then, and why.

The policy is configured for the server (``c.GpuSchedPolicy...`` in
``jupyter_server_config``), so this command reads those files as well as its own;
``--config FILE`` reads that one file instead, and ``--GpuSchedPolicy.timezone=...`` on the
command line overrides both. ``--service`` explains them as the lab-wide service applies them
(per-user limits on by default); ``--server`` asks the running server instead, which in client
mode asks the lab's service, and shows the caller's own limits too.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

from traitlets import Bool, TraitError, Unicode
from traitlets.config import Application, Config
from traitlets.config.loader import ConfigFileNotFound, JSONFileConfigLoader, PyFileConfigLoader

from jupyter_gpusched.core.windows import PolicyConfig, local_boundary, policy_view
from jupyter_gpusched.server.config import GpuSchedPolicy

from .base import GpuSchedCommand, UsageError, run_command

_AT_HELP = "'now', '2026-11-23 09:00' (policy timezone) or '2026-11-23T09:00+01:00'"
SERVER_CONFIG = "jupyter_server_config"


def load_config(config_file: str | None = None) -> Config:
    """The ``jupyter_server_config`` files on Jupyter's config path, or one given file."""
    config = Config()
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise FileNotFoundError(f"config file {config_file!r} does not exist")
        config.merge(_loader(path).load_config())
        return config
    from jupyter_core.paths import jupyter_config_path

    # Lowest priority first, so the user's own files override system-wide ones.
    for directory in reversed(jupyter_config_path()):
        for name in (f"{SERVER_CONFIG}.json", f"{SERVER_CONFIG}.py"):
            path = Path(directory) / name
            if path.is_file():
                try:
                    config.merge(_loader(path).load_config())
                except ConfigFileNotFound:
                    continue
    return config


def _loader(path: Path) -> JSONFileConfigLoader | PyFileConfigLoader:
    if path.suffix == ".json":
        return JSONFileConfigLoader(path.name, str(path.parent))
    return PyFileConfigLoader(path.name, str(path.parent))


def parse_at(text: str, policy: PolicyConfig, now: datetime) -> datetime:
    """Read ``--at``: 'now' or an ISO time; a time without offset is in the policy timezone.

    A local time skipped by a DST jump means the jump, an ambiguous one its first occurrence
    (the same rule the windows follow).
    """
    if text.strip().lower() == "now":
        return now
    raw = text.strip()
    if raw.endswith(("Z", "z")):
        raw = raw[:-1] + "+00:00"
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        raise ValueError(f"--at {text!r} is not a time; write {_AT_HELP}") from None
    if when.tzinfo is None:
        return local_boundary(when.date(), when.time(), policy.tz)
    return when.astimezone(UTC)


class PolicyApp(GpuSchedCommand):
    """Explain which time-of-day window, quotas and queue rules hold at a time."""

    command = "policy"
    description = "Explain which time-of-day window, quotas and queue rules hold at a time."
    examples = 'jupyter gpusched policy --at "2026-11-23 09:00" --GpuSchedPolicy.timezone=UTC'
    classes = [GpuSchedPolicy]

    at = Unicode("now", help=f"The instant to explain: {_AT_HELP}.").tag(config=True)
    json = Bool(False, help="Print JSON instead of text.").tag(config=True)
    service = Bool(
        False,
        help="Explain the configuration as the lab-wide service applies it (with "
        "GpuSchedPolicy.limit_defaults 'auto', its per-user limits are on there).",
    ).tag(config=True)
    server = Bool(
        False,
        help="Ask the running server (in client mode: the lab's service) what it applies, "
        "your own limits included, instead of reading the configuration here.",
    ).tag(config=True)

    aliases = {**GpuSchedCommand.aliases, "at": "PolicyApp.at"}
    flags = {
        **GpuSchedCommand.flags,
        "json": ({"PolicyApp": {"json": True}}, "Print JSON instead of text."),
        "service": (
            {"PolicyApp": {"service": True}},
            "Explain the configuration as the lab-wide service applies it.",
        ),
        "server": (
            {"PolicyApp": {"server": True}},
            "Ask the running server (or the lab's service) what it applies, your limits too.",
        ),
    }
    #: The instant "now" means (tests fix it); None = the wall clock.
    now: datetime | None = None

    def load_config_file(self, suppress_errors: bool = True) -> None:  # type: ignore[override]
        """The server's config files (where the policy lives), then this command's own."""
        if not self.config_file:
            Application.load_config_file(self, SERVER_CONFIG, path=self.config_file_paths)
        super().load_config_file(suppress_errors=suppress_errors)

    def check(self) -> None:
        """The policy (config) and the time are read before anything is printed."""
        self.positional("", at_most=0)
        try:
            self.policy = GpuSchedPolicy(parent=self).to_policy_config(service=self.service)
        except (TraitError, ValueError) as exc:
            raise UsageError(f"bad configuration: {exc}") from None
        try:
            self.when = parse_at(self.at, self.policy, self.now or datetime.now(UTC))
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    def run(self) -> int:
        """Print the explanation (or the API's JSON)."""
        if self.server:
            view = self.client().policy(at=self.when.isoformat())
        else:
            view = policy_view(self.policy, self.when)
        print(view.model_dump_json(indent=2) if self.json else view.explanation)
        return 0


def main(argv: list[str] | None = None, *, now: datetime | None = None) -> int:
    """Print the policy in force at ``--at``; 2 on a bad time or config."""
    return run_command(PolicyApp, sys.argv[1:] if argv is None else argv, now=now)
