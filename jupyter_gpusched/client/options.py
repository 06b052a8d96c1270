"""One option grammar for ``jupyter gpusched``, the ``%gpu`` magic and the API's field names.

Every option a job request takes is one :class:`Option` in :data:`OPTIONS`: its spelling, its
help, how its value is read, and the request field it sets. The command line builds its traits
and aliases from it (:mod:`jupyter_gpusched.cli.base`), the magic its parsers
(:func:`argparser`), and refusals name the option of a field (:data:`OPTION_OF`), so
``--gpu-mem 16G`` or ``-p lr=0.1`` mean the same wherever they are typed, and a word one of
them takes the other takes too.

The grammar, the same on both: options first; the first word that is not an option starts the
script and its arguments (``submit``) or names the notebook (``submit-notebook``); a word after
``--`` is never ours. An option neither knows is an error that says which one was meant
(:func:`unknown_option`) -- never a warning, never passed on to the script.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

from jupyter_gpusched.core.optwords import OptionError, split_argv, unknown_option
from jupyter_gpusched.core.units import parse_duration_s, parse_size_gb

__all__ = ["OptionError", "split_argv", "unknown_option"]  # the grammar's rules, from core

#: How an option's value is read: ``flag`` takes none, ``list`` may be repeated.
Kind = Literal["count", "size", "duration", "share", "number", "text", "choice", "list", "flag"]


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise ValueError(f"must be 0 or more, got {value}")
    return value


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not 0 < value <= 1:
        raise ValueError(f"must be in (0, 1], got {value}")
    return value


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not value > 0:
        raise ValueError(f"must be more than 0, got {value}")
    return value


#: Reads a value of each kind; raises ValueError with the words a user should read.
PARSE: dict[str, Callable[[str], Any]] = {
    "count": _count,
    "size": parse_size_gb,
    "duration": parse_duration_s,
    "share": _share,
    "number": _number,
}


@dataclass(frozen=True)
class Option:
    """One option of a job request, as every client spells, explains and reads it."""

    #: How it is typed, e.g. ``--gpu-mem``.
    flag: str
    #: What it means, for ``--help`` everywhere.
    help: str
    #: How its value is read.
    kind: Kind = "text"
    #: The API request field it sets (None: the client uses it itself).
    field: str | None = None
    #: A one-letter form, e.g. ``-p``.
    short: str | None = None
    #: The values a ``choice`` takes.
    choices: tuple[str, ...] = ()
    #: Attribute (trait) name when not the flag's (``--name`` is ``job_name``: apps have a name).
    attr: str | None = None
    #: Set on an old spelling kept working: the option to write instead.
    deprecated_for: str | None = None

    @property
    def name(self) -> str:
        """The attribute (and trait) that holds its value."""
        return self.attr or self.flag[2:].replace("-", "_")

    @property
    def word(self) -> str:
        """The flag without its dashes, as traitlets' aliases are written."""
        return self.flag[2:]

    def parse(self, text: str) -> Any:
        """The value of ``text`` (ValueError says what is wrong with it)."""
        if self.kind in PARSE:
            return PARSE[self.kind](text)
        if self.kind == "choice" and text not in self.choices:
            raise ValueError(f"{text!r} is not one of {', '.join(self.choices)}")
        return text


_GPU_MEM = (
    "GPU memory needed on each GPU, e.g. 16G. The GPU is then shared: other jobs asking for "
    "GPU memory or a share may use the rest of it (without --gpu-mem or --share a job's GPUs "
    "are its own)."
)

OPTIONS: dict[str, Option] = {
    o.flag: o
    for o in (
        Option("--gpus", "GPUs, all on one node (default 1).", "count", "gpus"),
        Option("--gpu-mem", _GPU_MEM, "size", "gpu_mem_gb"),
        Option(
            "--share",
            "Share of one GPU (0-1], e.g. 0.5; the rest may go to other shared jobs.",
            "share",
            "gpu_share",
        ),
        Option(
            "--model",
            "Allowed GPU model, e.g. A100 (repeat the option for more).",
            "list",
            "gpu_models",
        ),
        Option("--cpus", "CPU cores (default 1).", "number", "cpus"),
        Option(
            "--mem",
            "Host memory (RAM) of the job, e.g. 32G, as Slurm's --mem (default 4G); GPU "
            "memory is --gpu-mem.",
            "size",
            "mem_gb",
        ),
        Option(
            "--host-mem",
            "Old spelling of --mem (host memory).",
            "size",
            "mem_gb",
            deprecated_for="--mem",
        ),  # fmt: skip
        Option(
            "--max-runtime",
            "Stop after this long, e.g. 2h (it also makes the expected starts of the jobs "
            "behind it exact).",
            "duration",
            "max_runtime_s",
        ),
        Option("--name", "Display name of the job.", "text", "name", attr="job_name"),
        Option(
            "--priority",
            "Priority class: interactive or batch.",
            "choice",
            "priority",
            choices=("interactive", "batch"),
        ),
        Option(
            "--retries",
            "Run again this many times if it is lost (default 0).",
            "count",
            "retries",
        ),  # fmt: skip
        Option("--env", "NAME=VALUE: an environment variable of the job (repeat).", "list", "env"),
        Option(
            "--at",
            "When: now, tonight, a window name, an ISO time (without an offset: in "
            "--timezone), or for a notebook a cron expression like '0 2 * * *' (a recurring "
            "definition).",
            "text",
            "at",
        ),
        Option(
            "--timezone",
            "IANA timezone of --at's time or cron, e.g. Europe/Berlin (default: the policy's).",
            "text",
            "timezone",
        ),
        Option(
            "--workdir",
            "Working directory on the node (default: this one).",
            "text",
            "workdir",
        ),
        Option(
            "--staged",
            "Run the staged copies in the job's directory on the node, not here.",
            "flag",
        ),
        Option(
            "--array",
            "Queue this many copies as one array; each finds its index (0..N-1) in "
            "$GPUSCHED_ARRAY_INDEX.",
            "count",
        ),
        Option(
            "--parameter",
            "NAME=VALUE, a parameter of the notebook (repeat); VALUE is read as JSON or a "
            "Python literal, else as text: lr=0.1, epochs=3, tag=base.",
            "list",
            "parameters",
            short="-p",
        ),
        Option("--parameters-json", "All parameters as one JSON object.", "text"),
        Option("--kernel", "Kernel name (default: the notebook's).", "text", "kernel_name"),
        Option(
            "--catch-up",
            "After downtime (cron only): skip the missed runs, or run once.",
            "choice",
            "catch_up",
            choices=("skip", "once"),
        ),
        Option(
            "--cell-timeout",
            "Stop a cell after this long, e.g. 10m.",
            "duration",
            "cell_timeout_s",
        ),  # fmt: skip
        Option(
            "--retry-backoff",
            "First wait before a retry (default 1m).",
            "duration",
            "retry_backoff_s",
        ),  # fmt: skip
        Option("--lease", "Lease name; one remote kernel per name (default: default).", "text"),
        Option("--timeout", "Give up waiting for the lease after this, e.g. 5m.", "duration"),
    )
}

#: The options of ``queue`` (besides :data:`SERVER_OPTIONS`): ``QueueApp``'s traits and the
#: quick ``queue`` (:mod:`jupyter_gpusched.cli.quick`) both read them here, so the two take the
#: same words with the same meanings.
QUEUE_OPTIONS: dict[str, Option] = {
    o.flag: o
    for o in (
        Option("--all", "Include finished jobs.", "flag"),
        Option("--state", "Comma-separated states, e.g. queued,running.", "text"),
        Option("--user", "Only this user's jobs ('me' for yours).", "text"),
        Option("--limit", "At most this many rows.", "count"),
        Option("--array", "Only the jobs of this array (its id).", "count"),
        Option("--json", "Print the API's JSON.", "flag"),
    )
}
#: ``queue``'s rows when ``--limit`` is not given.
QUEUE_LIMIT = 100
#: ``queue``'s states when neither ``--state`` nor ``--all`` is given.
QUEUE_STATES = "queued,starting,running"

#: Where the server is, an option of every command (``GpuSchedCommand``).
SERVER_OPTIONS: dict[str, Option] = {
    o.flag: o
    for o in (
        Option(
            "--url",
            "Server URL with base_url; default: $GPUSCHED_URL, else the running server found "
            "like 'jupyter server list'.",
        ),
        Option("--token", "Server token; default: $GPUSCHED_TOKEN, or discovered."),
    )
}

#: What a job needs, for every kind of job.
RESOURCES = (
    "--gpus",
    "--gpu-mem",
    "--share",
    "--model",
    "--cpus",
    "--mem",
    "--host-mem",
    "--max-runtime",
)
_JOB = (*RESOURCES, "--name", "--priority", "--retries", "--env", "--at", "--timezone")

#: The options of each command, the same in the CLI and the magic (``cell`` is ``%%gpu``).
#: Only the CLI adds how it prints and where the server is (``--json``, ``--wait``, ``--url``,
#: ``--token``); the magic is told the server with ``%gpu config``.
COMMANDS: dict[str, tuple[str, ...]] = {
    "cell": (*RESOURCES, "--lease", "--timeout"),
    "submit": (*_JOB, "--workdir", "--staged", "--array"),
    "submit-notebook": (
        *_JOB,
        "--parameter",
        "--parameters-json",
        "--kernel",
        "--catch-up",
        "--cell-timeout",
        "--retry-backoff",
    ),
    "kernelspec": RESOURCES,
}

#: Request fields -> the option that sets them, to name the option in a refusal.
OPTION_OF: dict[str, str] = {
    o.field: o.flag for o in OPTIONS.values() if o.field and not o.deprecated_for
}

#: The options' help by flag word (``HELP["gpu-mem"]``), for helps written elsewhere.
HELP: dict[str, str] = {o.word: o.help for o in OPTIONS.values()}

#: Said once where ``--mem`` is used: it meant GPU memory before ``--gpu-mem`` existed.
MEM_NOTE = "--mem is host memory (RAM), as in Slurm; GPU memory per GPU is --gpu-mem"


def options_of(command: str) -> list[Option]:
    """The options ``command`` takes, in help order."""
    return [OPTIONS[f] for f in COMMANDS[command]]


def spellings(command: str) -> tuple[set[str], set[str]]:
    """``(spellings that take a value, spellings that do not)`` of ``command``'s options."""
    takes_value: set[str] = set()
    flags: set[str] = set()
    for option in options_of(command):
        names = {option.flag} | ({option.short} if option.short else set())
        (flags if option.kind == "flag" else takes_value).update(names)
    return takes_value, flags


def parse_parameter(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` with a typed value: JSON or a Python literal, else the text itself.

    ``lr=0.1`` -> float, ``epochs=3`` -> int, ``fast=true`` / ``fast=True`` -> bool,
    ``layers=[64,32]`` -> list, ``cfg={"a": 1}`` -> dict, ``name=resnet`` -> str.
    """
    name, sep, raw = text.partition("=")
    name = name.strip()
    if not sep or not name.isidentifier():
        raise ValueError(f"{text!r} is not NAME=VALUE with a valid variable name")
    import ast  # a notebook's parameters only: the quick ``queue`` reads this table too

    for parse in (json.loads, ast.literal_eval):
        try:
            return name, parse(raw)
        except (ValueError, SyntaxError, RecursionError):
            continue
    return name, raw


def parse_env(items: Iterable[str]) -> dict[str, str]:
    """``--env NAME=VALUE`` items as a mapping."""
    env = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--env {item!r}: write it as NAME=VALUE")
        env[name] = value
    return env


def request_fields(command: str, values: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``(request fields, notes)`` of the option values given (by :attr:`Option.name`).

    Options left out (None, empty) are left to the server's defaults. ``notes`` are the lines
    to say first: an old spelling used, or ``--mem`` (which meant GPU memory before).
    """
    fields: dict[str, Any] = {}
    notes: list[str] = []
    for option in options_of(command):
        value = values.get(option.name)
        if option.field is None or value is None or value == [] or value is False:
            continue
        if option.deprecated_for:
            notes.append(f"{option.flag} is deprecated; write {option.deprecated_for}")
        elif option.flag == "--mem":
            notes.append(MEM_NOTE)
        if option.flag == "--env":
            value = parse_env(value)
        elif option.flag == "--parameter":
            value = dict(parse_parameter(t) for t in value)
        elif option.kind == "list":
            value = list(value)
        fields[option.field] = value
    return fields, notes


def merge_parameters(fields: dict[str, Any], parameters_json: str | None) -> None:
    """Add ``--parameters-json`` to the ``-p`` parameters in ``fields`` (``-p`` wins)."""
    parameters = fields.pop("parameters", {})
    if parameters_json:
        try:
            extra = json.loads(parameters_json)
        except ValueError as exc:
            raise ValueError(f"--parameters-json: {exc}") from None
        if not isinstance(extra, dict):
            raise ValueError("--parameters-json must be a JSON object")
        parameters = {**extra, **parameters}
    fields["parameters"] = parameters


def resource_fields(
    *,
    gpus: int | None = None,
    gpu_mem_gb: float | None = None,
    share: float | None = None,
    models: list[str] | None = None,
    max_runtime_s: float | None = None,
    **more: Any,
) -> dict[str, Any]:
    """The request fields of the resource options given (the server's defaults for the rest)."""
    fields = {
        "gpus": gpus,
        "gpu_mem_gb": gpu_mem_gb,
        "gpu_share": share,
        "gpu_models": list(models) if models else None,
        "max_runtime_s": max_runtime_s,
        **more,
    }
    return {k: v for k, v in fields.items() if v is not None}


#: Programs that run the file named after them: ``python train.py`` names ``train.py``.
_INTERPRETERS = re.compile(r"^(python[0-9.]*|bash|sh|zsh|Rscript|julia|perl|node|torchrun)$")
_SCRIPT = re.compile(r"\.(py|sh|bash|R|jl|pl|js|ipynb)$")


def named_script(command: list[str]) -> str | None:
    """The script file a command runs, when it names one, else None.

    ``train.py`` in ``python -u train.py --lr 1``, ``./run.sh`` in ``./run.sh``; None for
    ``python -m pkg`` or ``python -c CODE``.
    """
    if not command:
        return None
    first = command[0]
    if "/" in first or _SCRIPT.search(first):
        return first
    if not _INTERPRETERS.match(os.path.basename(first)):
        return None
    for word in command[1:]:
        if word in ("-m", "-c", "-e"):
            return None
        if not word.startswith("-"):
            return word if _SCRIPT.search(word) else None
    return None


def missing_script(command: list[str], cwd: str) -> str | None:
    """What to say when the script ``command`` runs is not a file in ``cwd`` (else None).

    Checked when a job is submitted, not minutes later on the node. An absolute path may be
    the node's own, so only relative ones are checked.
    """
    script = named_script(command)
    if script is None or os.path.isabs(script) or os.path.isfile(os.path.join(cwd, script)):
        return None
    return f"no file {script!r} in {cwd} (the script the job would run)"


class _Parser(argparse.ArgumentParser):
    """argparse that raises :class:`OptionError` instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:  # noqa: D102
        raise OptionError(message)


def argparser(command: str, prog: str, usage: str, description: str) -> argparse.ArgumentParser:
    """An argparse parser of ``command``'s options, for a client that is not a traitlets app.

    Values are read by the grammar's own functions, so errors read as on the command line
    (``argument --gpus: 'two' is not a whole number``); options left out are None.
    """
    parser = _Parser(
        prog=prog,
        usage=usage.replace("%", "%%"),  # argparse %-formats it: '%%gpu' would print '%gpu'
        description=description,
        allow_abbrev=False,
        add_help=False,
    )
    for option in options_of(command):
        names = [option.flag] + ([option.short] if option.short else [])
        if option.kind == "flag":
            parser.add_argument(
                *names, dest=option.name, action="store_true", help=option.help.replace("%", "%%")
            )
            continue

        def convert(text: str, option: Option = option) -> Any:
            try:
                return option.parse(text)
            except ValueError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None

        convert.__name__ = option.kind  # argparse names the type in some errors
        parser.add_argument(
            *names,
            dest=option.name,
            type=convert,
            action="append" if option.kind == "list" else "store",
            metavar=option.word.upper().replace("-", "_"),
            help=option.help.replace("%", "%%"),
        )
    return parser
