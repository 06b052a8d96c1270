"""Progress lines in a notebook job's log, and logs without them for people.

``nbrun`` writes ``##gpusched-progress {json}`` lines into the job's log; the server turns them
into ``progress`` events and the lab's log view into a status line. Nowhere a user reads the
log as text (``jupyter gpusched logs``, ``%gpu logs``, the ``.log`` copied beside the notebook)
should they appear: :class:`ProgressFilter` drops them from a stream of bytes, a line split
across chunks included.
"""

from __future__ import annotations

import json
from typing import Any

#: Prefix of a progress line in a notebook job's log; the rest of the line is one JSON object.
PROGRESS_MARK = "##gpusched-progress "
_MARK = PROGRESS_MARK.encode()


def parse_progress(line: str) -> dict[str, Any] | None:
    """The detail of a progress line, None for any other line (or a garbled one)."""
    if not line.startswith(PROGRESS_MARK):
        return None
    try:
        detail = json.loads(line[len(PROGRESS_MARK) :])
    except ValueError:
        return None
    return detail if isinstance(detail, dict) else None


class ProgressFilter:
    """Log bytes in, the same bytes out without the progress lines.

    A line that may still become a progress line is held until it is complete; everything
    else passes at once, so a followed log shows output as it comes.
    """

    def __init__(self) -> None:
        self._held = b""
        self._line_start = True

    def feed(self, chunk: bytes) -> bytes:
        """The bytes of ``chunk`` (after what was held) to show now."""
        data, self._held = self._held + chunk, b""
        out = bytearray()
        while data:
            if self._line_start:
                head = data[: len(_MARK)]
                if _MARK.startswith(head) and len(head) < len(_MARK) and b"\n" not in head:
                    self._held = data  # too short to tell yet
                    break
                if head == _MARK:
                    end = data.find(b"\n")
                    if end < 0:
                        self._held = data
                        break
                    if parse_progress(data[:end].decode("utf-8", "replace")) is not None:
                        data = data[end + 1 :]
                        continue
            end = data.find(b"\n")
            if end < 0:
                out += data
                self._line_start = False
                break
            out += data[: end + 1]
            data = data[end + 1 :]
            self._line_start = True
        return bytes(out)

    def close(self) -> bytes:
        """What was held at the end of the log (an unfinished line is shown as it is)."""
        held, self._held = self._held, b""
        if held.startswith(_MARK) and parse_progress(held.decode("utf-8", "replace").rstrip()):
            return b""
        return held


def strip_progress(data: bytes) -> bytes:
    """A whole log without its progress lines."""
    f = ProgressFilter()
    return f.feed(data) + f.close()
