"""Text safe to print as one terminal line (every room's one-line errors: the lake's, the
command's usage errors). Standard library only, so that a command that only prints an error
(a usage error, `tracelake --help`) imports nothing heavier to print it."""

from __future__ import annotations

import re

# the characters one_line escapes (C0 and C1 controls, DEL), as a regular expression
CONTROL_CHARS = r"[\x00-\x1f\x7f-\x9f]"
_CONTROL = re.compile(CONTROL_CHARS)


def one_line(text: str | None) -> str | None:
    """Text safe to print as one terminal line: control characters (newlines, ESC, ...) become
    \\xNN escapes. None stays None."""
    if text is None:
        return None
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
