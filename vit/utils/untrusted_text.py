"""Text that comes from outside (file names, class names, label names) made safe for where it goes.

- A spreadsheet cell (`csv_cell`): a cell starting with `=`, `+`, `-`, `@`, a tab or a carriage return is a
  formula to Excel, LibreOffice and Google Sheets (`=HYPERLINK(...)`, DDE `=cmd|...`); OWASP's advice is a leading
  single quote, which makes it text. Numbers (and text that is exactly a number) stay as they are. NUL, which no
  CSV reader keeps, becomes the four characters `\\x00`.
- A file name that is not UTF-8 (Python holds its bytes as lone surrogates, `surrogateescape`) cannot be written
  as UTF-8 text: each such byte becomes `\\xNN`, so the row is still there and names its file readably.
- A terminal (`printable`): control characters (ANSI escape sequences clear the screen, recolour or retitle it),
  bidirectional overrides and undecodable bytes are shown as backslash escapes instead of acting.

Standard library only: vit/utils/atomic.py's CSV writer uses it.
"""

from __future__ import annotations

import unicodedata

__all__ = ["csv_cell", "printable", "unsurrogate"]

FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n")  # OWASP's list, and a line feed as some sheets trim it
_BIDI = {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C)}


def _escape(ch: str) -> str:
    o = ord(ch)
    if 0xDC80 <= o <= 0xDCFF:  # a byte surrogateescape could not decode
        return f"\\x{o - 0xDC00:02x}"
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


def unsurrogate(text: str) -> str:
    """`text` encodable as UTF-8: lone surrogates (undecodable file-name bytes) as `\\xNN` / `\\uNNNN`."""
    if text.isascii():
        return text
    return "".join(_escape(ch) if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in text)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return text.strip() == text


def csv_cell(value):
    """A value as it may go into a CSV cell: non-text unchanged; text without NUL or surrogates, and with a
    leading `'` if a spreadsheet would read it as a formula."""
    if not isinstance(value, str):
        return value
    text = unsurrogate(value).replace("\x00", "\\x00")
    if text.startswith(FORMULA_START) and not _is_number(text):
        text = "'" + text
    return text


def printable(text, keep: str = "") -> str:
    """`str(text)` safe to print: control and format characters, bidi overrides and surrogates escaped, except
    the characters in `keep` (a message's own line breaks: "\n")."""
    text = str(text)
    if text.isascii() and text.isprintable():
        return text
    return "".join(_escape(ch) if (unicodedata.category(ch) in ("Cc", "Cs") or ch in _BIDI) and ch not in keep
                   else ch for ch in text)
