"""What every command line of ours refuses: an option nobody knows, said with the one meant.

traitlets' command-line loader only warns "Unrecognized alias ..., it will have no effect" and
goes on (``submit --gpu 2`` queued a 1-GPU job, exit 0); argparse says "unrecognized
arguments". :class:`StrictLoader` (for every traitlets app of ours: the CLI, the service) and
:func:`split_argv` (for the ``%gpu`` magic's parsers) refuse it with ``did you mean --gpus?``.
Standard library and traitlets only; the words' rules themselves are in :mod:`.optwords`
(standard library only, for the quick ``queue``).
"""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from traitlets.config.loader import KVArgParseConfigLoader, _KVArgParser

from .optwords import OptionError, split_argv, unknown_option

__all__ = [
    "OneLineParser",
    "OptionError",
    "StrictLoader",
    "check_argparse",
    "split_argv",
    "unknown_option",
]


def check_argparse(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """Refuse an option ``parser`` does not know (or abbreviates), naming the one meant.

    argparse says only "unrecognized arguments", and takes ``--al`` for ``--all``.
    """
    actions = parser._actions
    takes_value = {o for a in actions if a.nargs != 0 for o in a.option_strings}
    flags = {o for a in actions if a.nargs == 0 for o in a.option_strings}
    cut = argv.index("--") if "--" in argv else len(argv)
    split_argv(argv[:cut], takes_value, flags)


def _spellings(keys: Any) -> list[str]:
    keys = keys if isinstance(keys, tuple) else (keys,)
    return [f"-{k}" if len(k) == 1 else f"--{k}" for k in keys]


class OneLineParser(_KVArgParser):
    """Argument errors as one line and exit status 2, not argparse's usage block."""

    def error(self, message: str) -> NoReturn:  # noqa: D102
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class StrictLoader(KVArgParseConfigLoader):
    """traitlets' command-line loader, refusing an option no alias, flag or trait knows.

    ``--Class.trait`` is known when the class is one of the app's and has that config trait;
    words after ``--`` are never options. The error is the parser's (exit 2).
    """

    parser_class = OneLineParser
    #: Added to the error of an unknown option after a positional word (see split_argv).
    hint = ""
    #: Classes whose ``--Class.trait`` options are checked besides the app's own.
    extra_classes: tuple[type[Any], ...] = ()
    #: Whether ``--Class.trait`` of a class nobody here knows passes (a server's extensions
    #: read their own config from the server's command line).
    other_classes_ok = False

    def _parse_args(self, args: Any) -> Any:
        argv = [str(a) for a in args]
        if "--" in argv:
            argv = argv[: argv.index("--")]
        takes_value: set[str] = set()
        flags: set[str] = {"-h", "--help", "--help-all"}
        for keys in self.aliases:
            takes_value.update(_spellings(keys))
        for keys in self.flags:
            flags.update(_spellings(keys))
        classes = [*self.classes, *self.extra_classes]
        traits = {
            f"--{cls.__name__}.{name}" for cls in classes for name in cls.class_traits(config=True)
        }
        names = {cls.__name__ for cls in classes}

        def other_class(flag: str) -> bool:
            section = flag[2:].split(".", 1)[0]
            return self.other_classes_ok and "." in flag and section not in names

        try:
            split_argv(
                argv, (takes_value - flags) | traits, flags, known=other_class, hint=self.hint
            )
        except OptionError as exc:
            self.parser.error(str(exc))
        return super()._parse_args(args)

    def _handle_unrecognized_alias(self, arg: str) -> None:
        self.parser.error(f"unknown option --{arg}")  # not a warning that goes on without it
