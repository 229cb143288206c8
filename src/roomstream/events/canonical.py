"""Canonical JSON: encoding for hashes and signatures, strict decoding of untrusted input.

Canonical JSON (Matrix appendices) is the shortest UTF-8 encoding with object keys sorted
by code point, no insignificant whitespace, and integers only, in the range
``[-(2**53)+1, 2**53-1]``. Every hash and signature in an event is computed over it.

Two encoders are exposed:

* :func:`encode_canonical_json` validates the value against the Matrix rules and then
  delegates to :mod:`canonicaljson` (the reference encoder also used by ``signedjson``).
* :func:`encode_canonical_json_fast` is used on hot paths (content and reference hashes).
  It validates the same way and then encodes with ``orjson`` (sorted keys, compact), which
  produces byte-identical output for every value that passes validation; the test suite
  checks this against :mod:`canonicaljson` with generated values. It is several times
  faster, which matters for bulk import.

:func:`decode_json_object` parses untrusted bytes. Its contract (the slow, stdlib-based
parser is the authority; the ``orjson`` fast path only ever accepts what it accepts):

* not UTF-8, or not JSON at all                         -> ``M_NOT_JSON``
* valid JSON, but the top level is not an object        -> ``M_BAD_JSON``
* floats (``1.0``, ``1e3``), NaN / Infinity              -> ``M_BAD_JSON``
* integers outside ``[-(2**53)+1, 2**53-1]``             -> ``M_BAD_JSON``
* duplicate keys in any object                          -> ``M_BAD_JSON``
* lone UTF-16 surrogate escapes (``"\\ud800"``)         -> ``M_BAD_JSON``
* nesting deeper than :data:`MAX_NESTING_DEPTH`          -> ``M_BAD_JSON``

Room versions 1 to 5 predate strict canonical JSON (``RoomVersion.strict_canonical_json``):
their events may hold floats and integers of any size. Every function here takes
``strict=False`` for them: such numbers are then accepted (NaN and the infinities never
are, nor duplicate keys, lone surrogates or excessive nesting), and a value holding one
is encoded by :mod:`canonicaljson`, the encoder Synapse hashes and signs with (floats as
Python's ``repr``), so that event IDs and signatures agree with it.
"""

from __future__ import annotations

import json
import math
from typing import Any, NoReturn

import canonicaljson
import orjson

from roomstream.errors import EventNotJsonError, MalformedEventError

#: Largest and smallest integers canonical JSON allows.
MAX_SAFE_INTEGER = 2**53 - 1
MIN_SAFE_INTEGER = -(2**53) + 1

#: Containers may nest at most this deep (the top-level object counts as 1). The Matrix
#: spec sets no limit, but in practice one exists everywhere: serde_json-based servers
#: stop at 128, orjson's encoder at ~255 and Python's recursion limit at ~1000. A fixed,
#: documented limit keeps every later step (hashing, redaction, copying) free of
#: ``RecursionError``; no real event comes anywhere near it.
MAX_NESTING_DEPTH = 128

_ORJSON_CANONICAL = orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER


class _Reject(Exception):
    """Raised from inside stdlib decoder hooks; converted to BadEventError by the caller."""


def _bad(message: str) -> NoReturn:
    raise MalformedEventError(message)


def check_json_value(value: object, *, local: bool = False, strict: bool = True) -> None:
    """Check that ``value`` is representable as canonical JSON, or raise ``M_BAD_JSON``.

    ``strict=False`` (room versions 1 to 5): integers of any size and finite floats pass.

    Iterative (no recursion), breadth first so that nesting depth is known. With
    ``local=True`` (values built in-process rather than decoded) it also checks object
    keys are strings and accepts tuples as arrays; decoded JSON can contain neither
    non-string keys nor tuples, so the decoder skips that cost.
    """
    level: list[Any] = [value]
    depth = 0
    while level:
        nxt: list[Any] = []
        extend = nxt.extend
        has_container = False
        for v in level:
            t = type(v)
            if t is dict:
                has_container = True
                if local:
                    for k in v:
                        if type(k) is not str:
                            _bad(f"object keys must be strings, not {type(k).__name__}")
                extend(v.values())
            elif t is list or (local and t is tuple):
                has_container = True
                extend(v)
            elif t is int:
                if strict and not MIN_SAFE_INTEGER <= v <= MAX_SAFE_INTEGER:
                    _bad("integers must be within [-(2**53)+1, 2**53-1]")
            elif t is float and not strict:
                if not math.isfinite(v):
                    _bad("NaN and infinite numbers are not JSON")
            elif t is float:
                # Large integers also arrive here: orjson turns integers beyond 64 bits
                # into floats, so the message covers both.
                _bad("numbers must be integers within [-(2**53)+1, 2**53-1] (no floats)")
            elif t is str or t is bool or v is None:
                pass
            else:
                _bad(f"value of type {t.__name__} is not JSON")
        if has_container:
            depth += 1
            if depth > MAX_NESTING_DEPTH:
                _bad(f"JSON nested deeper than {MAX_NESTING_DEPTH} levels")
        level = nxt


def encode_canonical_json(value: object) -> bytes:
    """Encode ``value`` as canonical JSON with the reference encoder (:mod:`canonicaljson`).

    Raises ``BadEventError(M_BAD_JSON)`` if the value is not valid canonical JSON (floats,
    out-of-range integers, non-string keys, lone surrogates, too deep), because
    :mod:`canonicaljson` itself would happily encode floats.
    """
    check_json_value(value, local=True)
    try:
        return bytes(canonicaljson.encode_canonical_json(value))
    except (UnicodeEncodeError, ValueError) as e:
        _bad(f"value cannot be encoded as canonical JSON: {e}")


def encode_canonical_json_fast(value: object, *, strict: bool = True) -> bytes:
    """Encode ``value`` as canonical JSON using orjson; same bytes as the reference encoder.

    Validates like :func:`encode_canonical_json`. orjson's ``OPT_SORT_KEYS`` sorts by
    code point (identical to UTF-8 byte order) and its escaping of ``"``, ``\\`` and
    control characters matches Python's ``json`` with ``ensure_ascii=False``.

    ``strict=False``: a value with floats or integers outside the canonical range (room
    versions 1 to 5) is encoded by :mod:`canonicaljson` instead; others as above.
    """
    if strict:
        check_json_value(value, local=True)
        return _orjson_canonical(value)
    try:
        check_json_value(value, local=True)
    except MalformedEventError:
        check_json_value(value, local=True, strict=False)
        try:
            return bytes(canonicaljson.encode_canonical_json(value))
        except (UnicodeEncodeError, ValueError) as e:
            _bad(f"value cannot be encoded as canonical JSON: {e}")
    return _orjson_canonical(value)


def _orjson_canonical(value: object) -> bytes:
    """orjson canonical encoding of an already-checked value (no re-validation)."""
    try:
        return orjson.dumps(value, option=_ORJSON_CANONICAL)
    except orjson.JSONEncodeError as e:
        # Lone surrogates in strings are the one thing the scan does not look for.
        _bad(f"value cannot be encoded as canonical JSON: {e}")


# --- decoding --------------------------------------------------------------------------


def _reject_constant(name: str) -> NoReturn:
    raise _Reject(f"{name} is not allowed in canonical JSON")


def _reject_float(text: str) -> NoReturn:
    raise _Reject(f"non-integer number {text[:32]!r} is not allowed")


def _pairs_no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Reject(f"duplicate key {key[:64]!r} in object")
            seen.add(key)
    return result


_STRICT_DECODER = json.JSONDecoder(
    object_pairs_hook=_pairs_no_duplicates,
    parse_constant=_reject_constant,
    parse_float=_reject_float,
)
# Room versions 1 to 5: floats and big integers are JSON like any other number.
_LENIENT_DECODER = json.JSONDecoder(
    object_pairs_hook=_pairs_no_duplicates, parse_constant=_reject_constant
)
# Only used once orjson has accepted the document, to detect duplicate keys.
_DUPLICATE_DECODER = json.JSONDecoder(object_pairs_hook=_pairs_no_duplicates)


def decode_json_object(raw: bytes, *, strict: bool = True) -> dict[str, Any]:
    """Strictly decode an untrusted JSON object; see the module docstring for the rules.

    Invariant: the result contains only ``dict`` (string keys), ``list``, ``str``, ``int``
    (in the canonical range), ``bool`` and ``None``, nests at most
    :data:`MAX_NESTING_DEPTH` deep, and re-encodes to canonical JSON without error.
    ``strict=False`` (room versions 1 to 5) also admits finite floats and integers of
    any size, which re-encode with ``encode_canonical_json_fast(strict=False)``.
    """
    if not isinstance(raw, bytes):
        raise TypeError("decode_json_object expects bytes")
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        # orjson refuses: let the careful parser decide exactly why (and with which code).
        return _decode_slow(raw, strict=strict)
    if type(value) is not dict:
        _bad("top-level JSON value must be an object")
    if not strict:
        # orjson turns integers beyond 64 bits into floats: only the stdlib parse keeps
        # them exact, so a document with any non-integer number takes the careful path.
        try:
            check_json_value(value)
        except MalformedEventError:
            return _decode_slow(raw, strict=False)
    check_json_value(value)
    # Fast duplicate-key test: if re-encoding reproduces raw byte for byte, raw holds
    # exactly the members of the parsed value, so orjson cannot have silently dropped a
    # duplicate. Tried sorted (canonical input) and in input order (compact, unsorted
    # UTF-8 input). Otherwise a stdlib parse whose only job is to spot duplicates decides.
    if _orjson_canonical(value) != raw and orjson.dumps(value) != raw:
        try:
            _DUPLICATE_DECODER.decode(raw.decode("utf-8"))
        except _Reject as e:
            _bad(str(e))
    return value


def _decode_slow(raw: bytes, *, strict: bool = True) -> dict[str, Any]:
    """The authoritative decoder (stdlib ``json`` with rejecting hooks)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise EventNotJsonError(f"body is not valid UTF-8: {e.reason}") from None
    try:
        value = (_STRICT_DECODER if strict else _LENIENT_DECODER).decode(text)
    except _Reject as e:
        _bad(str(e))
    except json.JSONDecodeError as e:
        raise EventNotJsonError(f"invalid JSON: {e}") from None
    except RecursionError:
        _bad(f"JSON nested deeper than {MAX_NESTING_DEPTH} levels")
    except ValueError as e:
        # e.g. integers with more digits than Python's int-parsing limit.
        _bad(f"unacceptable JSON value: {e}")
    if type(value) is not dict:
        _bad("top-level JSON value must be an object")
    check_json_value(value, strict=strict)
    # Lone surrogate escapes decode fine with the stdlib but cannot be encoded as UTF-8.
    encode_canonical_json_fast(value, strict=strict)
    return value
