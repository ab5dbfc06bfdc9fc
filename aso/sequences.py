"""Update sequences as a client sends them back (`since`), checked before the store reads them.

The embedded store's are numbers. CouchDB's are `N-<opaque>`, the opaque part an Erlang term
(a list of `{node, [begin, end], {seq, uuid, node}}`, one per shard copy) that CouchDB decodes
with `binary_to_term` unchecked (COUCHDB_SEQ_MAKES_ATOMS in aso/store.py): every atom it names is
made and never collected, and ~1,400 made-up atoms a request had ended the node in 768 requests.
So the front end decodes the term itself, refuses any other shape, and forwards a sequence only
when its atoms are nodes the store itself named (`nodes_of` of a sequence the store handed out).
"""

from __future__ import annotations

import base64
import binascii

import erlang

# The opaque part's text: the sequence pattern of aso.routes bounds its length.
MAX_TERM_BYTES = 1 << 20  # decompressed; a cluster of 3 nodes and q=64 is ~20 KiB


class Invalid(ValueError):
    pass


def check(text: str) -> frozenset[str]:
    """The store nodes a sequence names (none for a number, `0` or `now`); Invalid when it is
    not a sequence a store hands out."""
    if text == "now" or text.isdigit():
        return frozenset()
    _, dash, opaque = text.partition("-")
    if not dash:
        raise Invalid("a number, now, or an opaque sequence as the store handed it out")
    return nodes_of(opaque)


def nodes_of(opaque: str) -> frozenset[str]:
    """The node atoms of CouchDB's opaque sequence; Invalid for anything but its shape."""
    try:
        data = base64.urlsafe_b64decode(opaque + "=" * (-len(opaque) % 4))
    except (binascii.Error, ValueError):
        raise Invalid("an opaque sequence as the store handed it out (not base64)") from None
    if len(data) > 6 and data[1] == 80 and int.from_bytes(data[2:6], "big") > MAX_TERM_BYTES:
        raise Invalid("an opaque sequence as the store handed it out (too large)")
    try:
        term = erlang.binary_to_term(data)
    except Exception:  # erlang-py raises several kinds for a malformed term
        raise Invalid("an opaque sequence as the store handed it out (not a term)") from None
    if not isinstance(term, list) or not term:
        raise Invalid("an opaque sequence as the store handed it out (not a list of shards)")
    nodes: set[str] = set()
    for shard in term:
        nodes |= _shard_nodes(shard)
    return frozenset(nodes)


def _shard_nodes(shard: object) -> set[str]:
    """`{node, [begin, end], seq}` with seq an integer or `{integer, uuid, node}`."""
    wrong = Invalid("an opaque sequence as the store handed it out (not a shard's position)")
    if not (isinstance(shard, tuple) and len(shard) == 3):
        raise wrong
    node, span, seq = shard
    if not (isinstance(span, list) and len(span) == 2 and all(_integer(b) for b in span)):
        raise wrong
    nodes = {_atom(node, wrong)}
    if isinstance(seq, tuple) and len(seq) == 3:
        number, uuid, epoch = seq
        if not (_integer(number) and isinstance(uuid, bytes | erlang.OtpErlangBinary)):
            raise wrong
        nodes.add(_atom(epoch, wrong))
    elif not _integer(seq):
        raise wrong
    return nodes


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _atom(value: object, wrong: Invalid) -> str:
    if not isinstance(value, erlang.OtpErlangAtom):
        raise wrong
    name = value.value
    return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
