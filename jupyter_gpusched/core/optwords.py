"""The rules of our command lines' words: which are options, and what an unknown one meant.

Standard library only: the quick ``queue`` (:mod:`jupyter_gpusched.cli.quick`) reads its
words with the same table and rules as the full commands without importing traitlets;
:mod:`.cmdline` builds the traitlets loader on them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable


class OptionError(ValueError):
    """An argument the grammar refuses: one line saying what to write instead."""


def unknown_option(word: str, known: Iterable[str], *, hint: str = "") -> str:
    """``unknown option --gpu; did you mean --gpus?``, else with ``hint`` when given."""
    import difflib  # only when refusing a word: the quick path never pays for it

    flag = word.split("=", 1)[0]
    # compared without the dashes, which every spelling shares
    by_word = {k.lstrip("-"): k for k in known}
    close = difflib.get_close_matches(flag.lstrip("-"), sorted(by_word), n=1, cutoff=0.75)
    said = f"unknown option {flag}"
    if close:
        return f"{said}; did you mean {by_word[close[0]]}?"
    return f"{said} {hint}".rstrip()


_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")


def split_argv(
    argv: list[str],
    takes_value: set[str],
    flags: set[str],
    *,
    known: Callable[[str], bool] = lambda flag: False,
    hint: str = "",
) -> tuple[list[str], list[str]]:
    """``(option words, other words)`` of ``argv`` up to ``--``; an unknown option raises.

    ``takes_value`` and ``flags`` are the spellings a command knows (``--gpus``, ``-p``);
    ``known`` accepts more (the CLI's ``--Class.trait``). The word after an option that takes a
    value is its value, whatever it looks like (``--name -x``). ``hint`` is added to the error
    of an unknown option after the first other word (the script's own options go after ``--``).
    """
    ours: list[str] = []
    others: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        flag = word.split("=", 1)[0]
        if word == "-" or not word.startswith("-") or _NEGATIVE.match(word):
            others.append(word)
        elif flag in takes_value:
            ours.append(word)
            if "=" not in word and i + 1 < len(argv):
                i += 1
                ours.append(argv[i])
        elif flag in flags or known(flag):
            ours.append(word)
        else:
            said = unknown_option(word, takes_value | flags, hint=hint if others else "")
            raise OptionError(said)
        i += 1
    return ours, others
