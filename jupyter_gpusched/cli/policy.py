"""``jupyter gpusched policy --at "2026-11-23 09:00"``: which policy rules hold then, and why."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from traitlets import TraitError
from traitlets.config import Config
from traitlets.config.loader import ConfigFileNotFound, JSONFileConfigLoader, PyFileConfigLoader

from jupyter_gpusched.core.windows import PolicyConfig, local_boundary, policy_view
from jupyter_gpusched.server.config import GpuSchedPolicy

_AT_HELP = "'now', '2026-11-23 09:00' (policy timezone) or '2026-11-23T09:00+01:00'"


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
        for name in ("jupyter_server_config.json", "jupyter_server_config.py"):
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


def main(argv: list[str] | None = None, *, now: datetime | None = None) -> int:
    """Print the policy in force at ``--at``; 2 on a bad time or config."""
    parser = argparse.ArgumentParser(
        prog="jupyter gpusched policy",
        description="Explain which time-of-day window, quotas and queue rules hold at a time.",
    )
    parser.add_argument("--at", default="now", help=f"the instant to explain: {_AT_HELP}")
    parser.add_argument(
        "--config", metavar="FILE", help="a jupyter_server_config .py or .json file to read "
        "instead of the ones on Jupyter's config path (section GpuSchedPolicy)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        policy = GpuSchedPolicy(config=load_config(args.config)).to_policy_config()
    except (TraitError, ValueError, OSError) as exc:
        print(f"jupyter gpusched policy: bad configuration: {exc}", file=sys.stderr)
        return 2
    try:
        at = parse_at(args.at, policy, now or datetime.now(UTC))
    except ValueError as exc:
        print(f"jupyter gpusched policy: {exc}", file=sys.stderr)
        return 2
    view = policy_view(policy, at)
    if args.json:
        print(json.dumps(view, indent=2))
    else:
        print(view["explanation"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
