"""The plain-data wire format between the sandbox's harness and its candidate process.

One message is one line: a value as JSON, with tags for what JSON lacks. ``None``, bools,
ints, floats (NaN and infinities as JSON's extensions), strings and lists are themselves; a
JSON object is always a one-key tag: ``{"t": [...]}`` tuple, ``{"d": [[k, v], ...]}`` dict
(any hashable keys), ``{"s": [...]}`` set, ``{"fs": [...]}`` frozenset, ``{"b": "hex"}``
bytes, ``{"c": [re, im]}`` complex.

`loads` builds only those builtin types, so data from the candidate can never carry its own
``__eq__``, ``__repr__`` or ``__hash__`` into the harness: what the harness compares is plain
data. `dumps` accepts subclasses of the plain types (a namedtuple, a ``Counter``) and sends
their plain contents; anything else raises `NotPlainData`.

This file imports nothing from orl: the harness and the child (both run with ``python -I``)
load it by path.
"""
import json
import os

MAX_DEPTH = 200  # nesting of containers in one value


class NotPlainData(TypeError):
    """A value that the wire cannot carry (a function, a generator, a user-defined object)."""


class WireError(ValueError):
    """A line that is not a well-formed message."""


def _out(x, depth: int):
    if depth > MAX_DEPTH:
        raise NotPlainData(f"a value nested deeper than {MAX_DEPTH}")
    if x is None or x is True or x is False:
        return x
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return float(x)
    if isinstance(x, str):
        return str(x)
    d = depth + 1
    if isinstance(x, list):
        return [_out(v, d) for v in x]
    if isinstance(x, tuple):
        return {"t": [_out(v, d) for v in x]}
    if isinstance(x, dict):
        return {"d": [[_out(k, d), _out(v, d)] for k, v in x.items()]}
    if isinstance(x, frozenset):
        return {"fs": [_out(v, d) for v in x]}
    if isinstance(x, set):
        return {"s": [_out(v, d) for v in x]}
    if isinstance(x, (bytes, bytearray)):
        return {"b": bytes(x).hex()}
    if isinstance(x, complex):
        return {"c": [x.real, x.imag]}
    raise NotPlainData(f"a {type(x).__module__}.{type(x).__qualname__}, which is not plain data")


def _in(x, depth: int):
    if depth > MAX_DEPTH:
        raise WireError(f"a value nested deeper than {MAX_DEPTH}")
    t = type(x)
    if x is None or t in (bool, int, float, str):
        return x
    d = depth + 1
    if t is list:
        return [_in(v, d) for v in x]
    if t is dict and len(x) == 1:
        (tag, body), = x.items()
        if tag == "b" and type(body) is str:
            return bytes.fromhex(body)
        if type(body) is not list:
            raise WireError(f"tag {tag!r} with a {t.__name__} body")
        items = [_in(v, d) for v in body]
        if tag == "t":
            return tuple(items)
        if tag == "s":
            return set(items)
        if tag == "fs":
            return frozenset(items)
        if tag == "c" and len(items) == 2 and all(type(v) in (int, float) for v in items):
            return complex(items[0], items[1])
        if tag == "d" and all(type(kv) is list and len(kv) == 2 for kv in items):
            return {k: v for k, v in items}
    raise WireError(f"not a tagged value: {str(x)[:80]}")


def dumps(value) -> bytes:
    """One message line (ends with a newline) for ``value``; raises `NotPlainData`."""
    try:
        return json.dumps(_out(value, 0), separators=(",", ":")).encode() + b"\n"
    except (ValueError, RecursionError) as e:  # ints over Python's digit limit, cycles
        raise NotPlainData(str(e)) from None


def loads(line: bytes):
    """The plain value in one message line; raises `WireError` for anything malformed."""
    try:
        return _in(json.loads(line), 0)
    except WireError:
        raise
    except (ValueError, TypeError, RecursionError) as e:  # bad JSON, unhashable set items
        raise WireError(f"{type(e).__name__}: {e}") from None


class LineReader:
    """Message lines from a file descriptor, at most ``limit`` bytes each."""

    def __init__(self, fd: int, limit: int):
        self.fd, self.limit, self.buf = fd, limit, bytearray()

    def readline(self) -> bytes | None:
        """The next line without its newline; None at end of file; `WireError` if too long."""
        while True:
            end = self.buf.find(b"\n")
            if end > self.limit or (end < 0 and len(self.buf) > self.limit):
                raise WireError(f"a message larger than {self.limit} bytes")
            if end >= 0:
                line = bytes(self.buf[:end])
                del self.buf[:end + 1]
                return line
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buf += chunk
