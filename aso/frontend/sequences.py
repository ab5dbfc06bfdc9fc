"""Update sequences as a client sends them back (`since`), checked before the store reads them.

The embedded store's are numbers. CouchDB's are `N-<opaque>`, the opaque part an Erlang term
(a list of `{node, [begin, end], {seq, uuid, node}}`, one per shard copy) that CouchDB decodes
with `binary_to_term` unchecked (COUCHDB_SEQ_MAKES_ATOMS): every atom it names is
made and never collected, and ~1,400 made-up atoms a request had ended the node in 768 requests.
So the front end decodes the term itself, refuses any other shape, and forwards a sequence only
when its atoms are nodes the store itself named (`check` of a sequence the store handed out).

The decoder is ASO's own and reads only the few kinds of terms a sequence holds, each in time
linear in its size: a general one (erlang-py) decoded a big integer in quadratic time (a 100 KB
one, 232 characters compressed, took 8 s of the front end's CPU).
"""

from __future__ import annotations

import base64
import binascii
import struct
import zlib

MAX_TERM_BYTES = 64 << 10  # decompressed; a cluster of 3 nodes and q=64 is ~20 KiB
MAX_DEPTH = 8  # a shard's position is 3 deep


class Invalid(ValueError):
    pass


class Atom(str):
    """An Erlang atom, by its name."""


def check(text: str) -> frozenset[str]:
    """The store nodes a sequence names (none for a number, `0` or `now`); Invalid when it is
    not a sequence a store hands out."""
    if text == "now" or is_number(text):
        return frozenset()
    _, dash, opaque = text.partition("-")
    if not dash:
        raise Invalid("a number, now, or an opaque sequence as the store handed it out")
    return nodes_of(opaque)


def as_written(since: str) -> int | str:
    """A sequence as a store writes it in JSON: a number as a number (the embedded store's),
    CouchDB's opaque ones as strings."""
    return int(since) if is_number(since) else since


def is_number(text: str) -> bool:
    """A sequence of the embedded store's (a number), not CouchDB's opaque kind."""
    return text.isascii() and text.isdigit()  # str.isdigit alone takes "²"


def nodes_of(opaque: str) -> frozenset[str]:
    """The node atoms of CouchDB's opaque sequence; Invalid for anything but its shape."""
    term = decode(opaque)
    if not isinstance(term, list) or not term:
        raise Invalid("an opaque sequence as the store handed it out (not a list of shards)")
    nodes: set[str] = set()
    for shard in term:
        nodes |= _shard_nodes(shard)
    return frozenset(nodes)


def decode(opaque: str) -> object:
    """The term of base64url text of Erlang's external term format, as CouchDB writes it."""
    try:
        data = base64.urlsafe_b64decode(opaque + "=" * (-len(opaque) % 4))
    except (binascii.Error, ValueError):
        raise Invalid("an opaque sequence as the store handed it out (not base64)") from None
    if data[:1] != b"\x83":
        raise Invalid("an opaque sequence as the store handed it out (not a term)")
    data = data[1:]
    if data[:1] == b"P":  # compressed: a 4-byte size, then zlib
        inflater = zlib.decompressobj()
        try:
            data = inflater.decompress(data[5:], MAX_TERM_BYTES + 1)
        except zlib.error:
            raise Invalid("an opaque sequence as the store handed it out (not zlib)") from None
    if len(data) > MAX_TERM_BYTES:
        raise Invalid("an opaque sequence as the store handed it out (too large)")
    try:
        term, end = _term(data, 0, 0)
    except (IndexError, struct.error, UnicodeDecodeError):
        raise Invalid("an opaque sequence as the store handed it out (not a term)") from None
    if end != len(data):
        raise Invalid("an opaque sequence as the store handed it out (bytes after its term)")
    return term


def _term(data: bytes, at: int, depth: int) -> tuple[object, int]:
    """The term at `at` and where it ends: integers, atoms, binaries, tuples, proper lists."""
    if depth > MAX_DEPTH:
        raise Invalid("an opaque sequence as the store handed it out (nested too deep)")
    tag = data[at]
    at += 1
    if tag == 97:  # SMALL_INTEGER_EXT
        return data[at], at + 1
    if tag == 98:  # INTEGER_EXT
        return struct.unpack_from(">i", data, at)[0], at + 4
    if tag == 110:  # SMALL_BIG_EXT: sequences are at most 64-bit
        size, sign = data[at], data[at + 1]
        if size > 8 or at + 2 + size > len(data):
            raise Invalid("an opaque sequence as the store handed it out (a number too large)")
        value = int.from_bytes(data[at + 2 : at + 2 + size], "little")
        return (-value if sign else value), at + 2 + size
    if tag in (100, 118):  # ATOM_EXT, ATOM_UTF8_EXT
        size = struct.unpack_from(">H", data, at)[0]
        return _atom(data, at + 2, size)
    if tag in (115, 119):  # SMALL_ATOM_EXT, SMALL_ATOM_UTF8_EXT
        return _atom(data, at + 1, data[at])
    if tag == 109:  # BINARY_EXT
        size = struct.unpack_from(">I", data, at)[0]
        if at + 4 + size > len(data):
            raise IndexError
        return data[at + 4 : at + 4 + size], at + 4 + size
    if tag == 104:  # SMALL_TUPLE_EXT
        items, at = _items(data, at + 1, data[at], depth)
        return tuple(items), at
    if tag == 106:  # NIL_EXT
        return [], at
    if tag == 107:  # STRING_EXT: a list of small integers
        size = struct.unpack_from(">H", data, at)[0]
        if at + 2 + size > len(data):
            raise IndexError
        return list(data[at + 2 : at + 2 + size]), at + 2 + size
    if tag == 108:  # LIST_EXT, then its tail: NIL for a proper list
        size = struct.unpack_from(">I", data, at)[0]
        items, at = _items(data, at + 4, size, depth)
        if data[at] != 106:
            raise Invalid("an opaque sequence as the store handed it out (an improper list)")
        return items, at + 1
    raise Invalid("an opaque sequence as the store handed it out (a kind of term it never holds)")


def _items(data: bytes, at: int, count: int, depth: int) -> tuple[list[object], int]:
    items = []
    for _ in range(count):  # each item takes a byte at least: a false count runs out of data
        item, at = _term(data, at, depth + 1)
        items.append(item)
    return items, at


def _atom(data: bytes, at: int, size: int) -> tuple[Atom, int]:
    if at + size > len(data):
        raise IndexError
    return Atom(data[at : at + size].decode("utf-8")), at + size


def _shard_nodes(shard: object) -> set[str]:
    """`{node, [begin, end], seq}` with seq an integer or `{integer, uuid, node}`."""
    wrong = Invalid("an opaque sequence as the store handed it out (not a shard's position)")
    if not (isinstance(shard, tuple) and len(shard) == 3):
        raise wrong
    node, span, seq = shard
    if not (isinstance(span, list) and len(span) == 2 and all(_integer(b) for b in span)):
        raise wrong
    if span[0] > span[1]:  # CouchDB fails on a range that ends before it begins (500)
        raise Invalid("an opaque sequence as the store handed it out (a shard range reversed)")
    if not isinstance(node, Atom):
        raise wrong
    nodes = {str(node)}
    if isinstance(seq, tuple) and len(seq) == 3:
        number, uuid, epoch = seq
        if not (_integer(number) and isinstance(uuid, bytes) and isinstance(epoch, Atom)):
            raise wrong
        nodes.add(str(epoch))
    elif not _integer(seq):
        raise wrong
    return nodes


def _integer(value: object) -> bool:
    return isinstance(value, int) and value >= 0
