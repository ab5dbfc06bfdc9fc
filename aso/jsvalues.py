"""JSON values as the store's JavaScript sees them, where ASO's Python must measure or compare
a document as the store does: the front end bounds a document by its JSON.stringify length
(model.doc_chars), an upload compares two documents with validate_doc_update's same().

JavaScript differs from Python where it matters here: numbers are doubles (5.0 is an integer,
2**60 + 1 arrives as 2**60, -0 prints as 0); a string's length counts UTF-16 code units (an
emoji is 2); `for (key in obj)` visits integer-like keys first, in numeric order; JSON.stringify
writes numbers its own way (1e+21, 1e-7, no ".0") and escapes lone surrogates.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

# Integers a double holds exactly; beyond them two different JSON numbers become the same value.
MAX_SAFE_INTEGER = 2**53 - 1
# A member of this name is an object's prototype once a JavaScript store copies the object:
# the embedded store stores a document without it (EMBEDDED_DROPS_PROTO_MEMBERS).
PROTO = "__proto__"
BEYOND_SAFE = "number beyond 2^53"  # the type name both sides give such a number
_ARRAY_INDEX = re.compile(r"^(0|[1-9][0-9]*)$")
_LONE_SURROGATE = re.compile(
    r"[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]"
)


class _Undefined:
    """A member a document does not have (JavaScript's undefined)."""

    def __repr__(self) -> str:
        return "undefined"


UNDEFINED: Any = _Undefined()


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def typeof(value: Any) -> str:
    """The type name validate_doc_update.js's typeOf() gives a parsed JSON value."""
    if value is UNDEFINED:
        return "undefined"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if is_number(value):
        if not math.isfinite(value):
            return "non-finite number"
        if abs(value) > MAX_SAFE_INTEGER:
            return BEYOND_SAFE
        return "integer" if float(value).is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__  # not JSON at all


def lone_surrogate(text: str) -> bool:
    """Whether `text` holds a UTF-16 surrogate that is not half of a pair (JSON can carry one as
    a \\ud800 escape). It is no Unicode: CouchDB refuses such a body (400 invalid UTF-8 JSON),
    the embedded store keeps it, so the model refuses it on both. Python has already joined
    every valid pair of a JSON text into one character: any surrogate left is lone."""
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def length(text: str) -> int:
    """String length in UTF-16 code units."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def keys(obj: Mapping[str, Any]) -> Iterator[str]:
    """An object's keys in the order `for (key in obj)` visits them."""
    index = sorted((k for k in obj if _is_index(k)), key=int)
    return iter([*index, *(k for k in obj if not _is_index(k))])


def _is_index(key: str) -> bool:
    return bool(_ARRAY_INDEX.match(key)) and int(key) < 2**32 - 1


def same(a: Any, b: Any) -> bool:
    """validate_doc_update.js's same(): deep equality of JSON values, JavaScript's types."""
    ta = typeof(a)
    if ta != typeof(b):
        return False
    if ta == "array":
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if ta == "object":
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    equal: bool = a == b
    return equal


def number(value: float | int) -> str:
    """A number as JavaScript's JSON.stringify writes it (ECMA-262 Number::toString)."""
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    if isinstance(value, int) and abs(value) <= MAX_SAFE_INTEGER:
        return str(value)
    digits, exponent = _shortest(abs(float(value)))
    point = exponent + len(digits)  # the decimal point's place relative to the digits
    if len(digits) <= point <= 21:
        return sign + digits + "0" * (point - len(digits))
    if 0 < point <= 21:
        return sign + digits[:point] + "." + digits[point:]
    if -6 < point <= 0:
        return sign + "0." + "0" * -point + digits
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    shown = point - 1
    return f"{sign}{mantissa}e{'+' if shown > 0 else '-'}{abs(shown)}"


def _shortest(value: float) -> tuple[str, int]:
    """The shortest digits that read back as `value`, and their power of ten."""
    mantissa, _, exp = repr(value).partition("e")
    whole, _, fraction = mantissa.partition(".")
    fraction = fraction.rstrip("0") if fraction != "0" else ""
    digits = (whole + fraction).lstrip("0") or "0"
    exponent = int(exp or 0) - len(fraction)
    stripped = digits.rstrip("0")
    return stripped, exponent + len(digits) - len(stripped)


def stringify(value: Any) -> str:
    """JSON.stringify(value): the length validate_doc_update.js measures a document by, and
    how its messages quote a value."""
    if value is UNDEFINED:
        return "undefined"  # JSON.stringify(undefined) is undefined, which prints so
    if isinstance(value, dict):
        inner = ",".join(f"{_string(k)}:{stringify(value[k])}" for k in keys(value))
        return "{" + inner + "}"
    if isinstance(value, list):
        return "[" + ",".join(stringify(v) for v in value) + "]"
    if isinstance(value, str):
        return _string(value)
    if is_number(value):
        return number(value) if math.isfinite(value) else "null"
    return json.dumps(value)  # true, false, null


def _string(text: str) -> str:
    # Well-formed JSON.stringify (ES2019) escapes lone surrogates; Python writes them as they are.
    out = json.dumps(text, ensure_ascii=False)
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", out)
