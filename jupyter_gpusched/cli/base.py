"""What every ``jupyter gpusched`` subcommand shares: a JupyterApp that talks to the server.

Each subcommand is a :class:`GpuSchedCommand`: its options are traits, so they work as in every
Jupyter command (``--QueueApp.limit=20`` on the command line, ``c.QueueApp.limit = 20`` in
``jupyter_gpusched_config.py``, ``c.GpuSchedCommand.url = ...`` for all of them); the short
forms (``--limit 20``) are aliases. The options of a job are the grammar's
(:mod:`jupyter_gpusched.client.options`), the same as the ``%gpu`` magic's. Bad arguments print
one line and exit 2, before any server is asked -- a misspelt option too, naming the one meant
(traitlets itself only warns and goes on); a refusal by the server (or none found) prints one
line and exits 1.

Imports stay light: traitlets, jupyter_core and the standard library; the client (pydantic) is
imported when a command runs, never jupyter_server, tornado, SQLAlchemy or IPython.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from jupyter_core.application import JupyterApp, base_aliases, base_flags
from traitlets import Bool, Container, Dict, Enum, Float, Int, List, TraitError, TraitType, Unicode
from traitlets.config.loader import _DOT_REPLACEMENT, KVArgParseConfigLoader

from jupyter_gpusched.client.options import OPTIONS, PARSE, SERVER_OPTIONS, options_of
from jupyter_gpusched.core.cmdline import StrictLoader
from jupyter_gpusched.core.errors import GpuSchedError
from jupyter_gpusched.core.units import parse_duration_s, parse_size_gb

if TYPE_CHECKING:
    from jupyter_gpusched.client.api import GpuSchedClient


class UsageError(Exception):
    """Bad arguments: the command prints this one line and exits 2."""


# ---------------------------------------------------------------------------- traits


class Count(Int):  # type: ignore[type-arg]
    """A whole number >= 0 that says so when it is not."""

    def from_string(self, s: str) -> int | None:  # noqa: D102
        if self.allow_none and s == "None":
            return None
        try:
            value = int(s)
        except ValueError:
            raise TraitError(f"{s!r} is not a whole number") from None
        if value < 0:
            raise TraitError(f"must be 0 or more, got {value}")
        return value


class Size(Float):  # type: ignore[type-arg]
    """A size in GB, written ``16G``, ``512M`` or a number of GB."""

    def from_string(self, s: str) -> float | None:  # noqa: D102
        if self.allow_none and s == "None":
            return None
        try:
            return parse_size_gb(s)
        except ValueError as exc:
            raise TraitError(str(exc)) from None

    def validate(self, obj: Any, value: Any) -> Any:  # noqa: D102
        if isinstance(value, str):  # config files may write "16G" too
            value = self.from_string(value)
        return super().validate(obj, value)


class Duration(Float):  # type: ignore[type-arg]
    """A duration in seconds, written ``90s``, ``15m``, ``2h``, ``1h30m`` or seconds."""

    def from_string(self, s: str) -> float | None:  # noqa: D102
        if self.allow_none and s == "None":
            return None
        try:
            return parse_duration_s(s)
        except ValueError as exc:
            raise TraitError(str(exc)) from None

    def validate(self, obj: Any, value: Any) -> Any:  # noqa: D102
        if isinstance(value, str):
            value = self.from_string(value)
        return super().validate(obj, value)


class Share(Float):  # type: ignore[type-arg]
    """A share of one GPU, in (0, 1]."""

    def from_string(self, s: str) -> float | None:  # noqa: D102
        if self.allow_none and s == "None":
            return None
        try:
            value = float(s)
        except ValueError:
            raise TraitError(f"{s!r} is not a number") from None
        if not 0 < value <= 1:
            raise TraitError(f"must be in (0, 1], got {value}")
        return value


class Number(Float):  # type: ignore[type-arg]
    """A number > 0 that says so when it is not."""

    def from_string(self, s: str) -> float | None:  # noqa: D102
        if self.allow_none and s == "None":
            return None
        try:
            return PARSE["number"](s)  # type: ignore[no-any-return]
        except ValueError as exc:
            raise TraitError(str(exc)) from None


#: The trait of each kind of option value in :mod:`jupyter_gpusched.client.options`.
_TRAITS: dict[str, type[TraitType[Any, Any]]] = {
    "count": Count,
    "size": Size,
    "duration": Duration,
    "share": Share,
    "number": Number,
    "text": Unicode,
}


def option_trait(flag: str) -> TraitType[Any, Any]:
    """The config trait of one option of the grammar: its help, its reading of values."""
    option = OPTIONS[flag]
    if option.kind == "flag":
        return Bool(False, help=option.help).tag(config=True)
    if option.kind == "list":
        return List(Unicode(), help=option.help).tag(config=True)
    if option.kind == "choice":
        trait = Enum(option.choices, None, allow_none=True, help=option.help)
    else:
        trait = _TRAITS[option.kind](None, allow_none=True, help=option.help)
    # left out, the request leaves it to the server: --help says so rather than "None"
    trait.default_value_repr = lambda: "unset (the server's default)"  # type: ignore[method-assign]
    return trait.tag(config=True)


def option_aliases(command: str, cls: str) -> dict[Any, str]:
    """``--gpus`` for ``--<cls>.gpus``, and so on, for every option of ``command``."""
    aliases: dict[Any, str] = {}
    for option in options_of(command):
        if option.kind != "flag":
            key = (option.short[1:], option.word) if option.short else option.word
            aliases[key] = f"{cls}.{option.name}"
    return aliases


def option_flags(command: str, cls: str) -> dict[str, Any]:
    """The options of ``command`` that take no value, as traitlets flags."""
    return {
        o.word: ({cls: {o.name: True}}, o.help) for o in options_of(command) if o.kind == "flag"
    }


# ---------------------------------------------------------------------------- parsing


class _Loader(StrictLoader):
    """traitlets' command-line loader, refusing unknown options, checking each value it reads.

    traitlets converts values only when it applies the config, where an error has lost the
    option's name; converting here names it (``argument --gpus: 'two' is not a whole number``).
    """

    def _convert_to_config(self) -> None:
        options = {}
        for keys, target in self.aliases.items():
            for key in keys if isinstance(keys, tuple) else (keys,):
                options.setdefault(target, f"-{key}" if len(key) == 1 else f"--{key}")
        for dest, value in vars(self.parsed_data).items():
            name = dest.replace(_DOT_REPLACEMENT, ".")
            trait = self.argparse_traits.get(name)
            if trait is None or not isinstance(value, (str, list)):
                continue
            try:
                if isinstance(trait[0], (Container, Dict)):
                    trait[0].from_string_list(value if isinstance(value, list) else [value])
                else:  # a repeated option: the last one counts
                    trait[0].from_string(value[-1] if isinstance(value, list) else value)
            except (TraitError, ValueError) as exc:
                self.parser.error(f"argument {options.get(name, '--' + name)}: {exc}")
        super()._convert_to_config()


class GpuSchedCommand(JupyterApp):
    """Base of the subcommands: where the server is, and one-line errors."""

    name = "jupyter-gpusched"  # config file: jupyter_gpusched_config.py
    #: The word after ``jupyter gpusched``.
    command: ClassVar[str] = ""

    url = Unicode(help=SERVER_OPTIONS["--url"].help).tag(config=True)
    token = Unicode(help=SERVER_OPTIONS["--token"].help).tag(config=True)

    aliases = {
        **base_aliases,
        **{o.word: f"GpuSchedCommand.{o.name}" for o in SERVER_OPTIONS.values()},
    }
    flags = dict(base_flags)

    @property
    def prog(self) -> str:
        """How the command is written in messages."""
        return f"jupyter gpusched {self.command}".rstrip()

    def _create_loader(  # type: ignore[override]
        self, argv: list[str] | None, aliases: Any, flags: Any, classes: Any
    ) -> KVArgParseConfigLoader:
        loader = _Loader(argv, aliases, flags, classes=classes, log=self.log, prog=self.prog)
        if self.command == "submit":
            loader.hint = (
                f"(the command's own options go after '--': {self.prog} [OPTIONS] -- "
                "COMMAND ARGS...)"
            )
        return loader

    def initialize(self, argv: Any = None) -> None:
        """Read the arguments and config files, then check them (:meth:`check`)."""
        try:
            super().initialize(argv)
            if self.config_file and not os.path.isfile(self.config_file):
                raise UsageError(f"config file {self.config_file!r} does not exist")
            self.check()
        except (UsageError, TraitError) as exc:
            self.fail(str(exc))

    def check(self) -> None:
        """Check the arguments (raise :class:`UsageError`); runs before any server is asked."""

    def fail(self, message: str) -> NoReturn:
        """One usage line on stderr, exit 2."""
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        self.exit(2)
        raise AssertionError  # pragma: no cover - exit raises

    def positional(self, what: str, *, at_least: int = 0, at_most: int | None = None) -> list[str]:
        """The positional arguments, checked for how many there are."""
        args = list(self.extra_args)
        if len(args) < at_least:
            raise UsageError(f"the following arguments are required: {what}")
        if at_most is not None and len(args) > at_most:
            raise UsageError(f"unrecognized arguments: {' '.join(args[at_most:])}")
        return args

    def client(self) -> GpuSchedClient:
        """A client of the server given by ``--url``/``--token``, the environment, or found."""
        from jupyter_gpusched.client.api import GpuSchedClient, find_server

        info = find_server(self.url or None, self.token or None)
        return GpuSchedClient(info.url, info.token)

    def start(self) -> None:
        """Run the command; server refusals are one line and exit 1."""
        if self._dispatching:
            super().start()
            return
        try:
            code = self.run()
        except GpuSchedError as exc:
            print(f"{self.prog}: {exc.message}", file=sys.stderr)
            code = 1
        except KeyboardInterrupt:
            code = 130
        self.exit(code)

    def run(self) -> int:
        """What the command does; its exit status."""
        raise NotImplementedError


def job_ids(args: list[str]) -> list[int]:
    """Positional job (or definition) ids."""
    ids = []
    for arg in args:
        try:
            ids.append(int(arg))
        except ValueError:
            raise UsageError(f"argument ID: {arg!r} is not a whole number") from None
    return ids


#: A positional id: a job's, or task M of array N written ``N_M`` (as Slurm writes it).
TaskId = int | tuple[int, int]


def task_ids(args: list[str]) -> list[TaskId]:
    """Positional job ids, or array tasks as ``ID_INDEX`` (``123_7``)."""
    ids: list[TaskId] = []
    for arg in args:
        head, sep, tail = arg.partition("_")
        if sep and head.isdigit() and tail.isdigit():
            ids.append((int(head), int(tail)))
            continue
        try:
            ids.append(int(arg))
        except ValueError:
            raise UsageError(
                f"argument ID: {arg!r} is neither a job id nor an array task like 123_7"
            ) from None
    return ids


def run_command(app_class: type[JupyterApp], argv: list[str], **attrs: Any) -> int:
    """Run one command in this process; its exit status (for ``main`` and tests).

    ``attrs`` are set on the app before it starts (tests pass a fixed ``now``).
    """
    app = app_class()
    for key, value in attrs.items():
        setattr(app, key, value)
    try:
        app.initialize(argv)
        app.start()
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    finally:
        # the subcommand was made with instance(): forget it, or the next run reuses it
        sub = getattr(app, "subapp", None)
        for cls in {type(app), type(sub)} - {type(None)}:
            cls.clear_instance()
    return 0
