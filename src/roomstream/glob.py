"""The spec's glob patterns, matched in time bounded by pattern length times value length.

Filters (``types``, ``not_types``) use ``*`` alone: any run of characters, possibly
empty; every other character stands for itself, case-sensitively. Push rules'
``pattern`` (``event_match`` conditions, ``content`` rules) also use ``?`` (exactly one
character) and match case-insensitively; on ``content.body`` a pattern matches anywhere
the matched text starts and ends at a word boundary (Synapse's rule). A display name is
matched the same way with no wildcard at all. :func:`compile_glob` covers all of them
with options.

Why not a regular expression built from the pattern: ``*`` as ``.*`` makes a failing
match backtrack through every way of splitting the value between the stars,
exponential in the number of stars (a filter with 14 stars held the event loop for
minutes). Here a pattern is split at its ``*`` into fixed-length *segments* (literal
characters and ``?``) and matched greedily: the first segment at the start (or, for a
word search, at the leftmost word start), each later one at its leftmost occurrence
after the previous, the last one at the end (or at a word end). Leftmost is always
optimal because a segment has a fixed length, so an earlier end never leaves the
following segments less room. Each segment is searched with a regular expression of
literals and ``.`` only, with no quantifier, so a search costs at most (value length x
segment length) steps and the whole match at most (value length x pattern length); a
value shorter than the segments' total length fails at once.

Invariant (``tests/test_glob.py``): :meth:`Glob.matches` and :meth:`Glob.search_words`
agree with the naive recursive definition of the grammar on every pattern and value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["MAX_GLOB_LENGTH", "Glob", "compile_glob"]

#: Longest pattern accepted where a client supplies one (filters): 1,000 wildcards with
#: a character between each fit; real patterns are event types (at most 255 bytes).
MAX_GLOB_LENGTH = 2048


@dataclass(frozen=True)
class _Segment:
    """A run of the pattern between two ``*``: its search expression and its length."""

    expression: re.Pattern[str]
    length: int


@dataclass(frozen=True)
class Glob:
    """A compiled pattern. ``segments`` are the parts between ``*`` (the first and last
    may be empty: the pattern starts or ends with ``*``); ``starred`` says whether the
    pattern holds a ``*`` at all (without one it must match a whole value or word
    exactly)."""

    pattern: str
    segments: tuple[_Segment, ...]
    starred: bool
    min_length: int
    #: The first segment starting at a word start, the last ending at a word end, and a
    #: star-free pattern as a whole word: the searches of :meth:`search_words`.
    _head_word: re.Pattern[str]
    _tail_word: re.Pattern[str]

    def matches(self, value: str) -> bool:
        """Whether the pattern matches the whole of ``value``."""
        n = len(value)
        if n < self.min_length:
            return False
        segments = self.segments
        if not self.starred:
            return n == self.min_length and segments[0].expression.fullmatch(value) is not None
        head, tail = segments[0], segments[-1]
        if head.length and head.expression.match(value) is None:
            return False
        pos = self._middle(value, head.length)
        if pos < 0:
            return False
        start = n - tail.length
        return start >= pos and (
            tail.length == 0 or tail.expression.fullmatch(value, start) is not None
        )

    def search_words(self, value: str) -> bool:
        """Whether the pattern matches some part of ``value`` that starts at its start
        or after a non-word character and ends at its end or before one (``\\W``)."""
        if len(value) < self.min_length:
            return False
        if not self.starred:
            return self._head_word.search(value) is not None
        pos = 0
        if self.segments[0].length:
            found = self._head_word.search(value)
            if found is None:
                return False
            pos = found.end()
        pos = self._middle(value, pos)
        if pos < 0:
            return False
        # A trailing star ends the match at the value's end, always a word end.
        return self.segments[-1].length == 0 or self._tail_word.search(value, pos) is not None

    def _middle(self, value: str, pos: int) -> int:
        """Where the segments strictly between the first and last end when each is put at
        its leftmost place from ``pos`` on; -1 if one does not fit."""
        for segment in self.segments[1:-1]:
            found = segment.expression.search(value, pos)
            if found is None:
                return -1
            pos = found.end()
        return pos


def _segment_source(segment: str, wildcards: str) -> str:
    any_char = "?" in wildcards
    return "".join("." if any_char and c == "?" else re.escape(c) for c in segment)


#: Patterns up to this long are kept compiled (4,096 of them): event types and the like.
#: Longer ones (a display name may be kilobytes) are compiled per call, so the cache
#: stays small whatever clients send.
CACHED_LENGTH = 256


def compile_glob(pattern: str, *, wildcards: str = "*", ignore_case: bool = False) -> Glob:
    """``pattern`` compiled; ``wildcards`` says which of ``*`` and ``?`` are wildcards
    (``""``: a literal). Callers bound the length of patterns clients send
    (:data:`MAX_GLOB_LENGTH`); matching cost is bounded by it whatever the pattern."""
    if len(pattern) > CACHED_LENGTH:
        return _compile(pattern, wildcards, ignore_case)
    return _compile_cached(pattern, wildcards, ignore_case)


def _compile(pattern: str, wildcards: str, ignore_case: bool) -> Glob:
    flags = re.DOTALL | (re.IGNORECASE if ignore_case else 0)
    starred = "*" in wildcards and "*" in pattern
    parts = pattern.split("*") if starred else [pattern]
    if len(parts) > 2:
        # Empty middle parts are consecutive stars: one star means the same.
        parts = [parts[0], *(p for p in parts[1:-1] if p), parts[-1]]
    sources = [_segment_source(p, wildcards) for p in parts]
    segments = tuple(
        _Segment(re.compile(source, flags), len(part))
        for source, part in zip(sources, parts, strict=True)
    )
    # (?<!\w) and (?!\w): at a word boundary in the sense of Synapse's (^|\W) and (\W|$).
    head = rf"(?<!\w)(?:{sources[0]})"
    tail = rf"(?:{sources[-1]})(?!\w)"
    return Glob(
        pattern=pattern,
        segments=segments,
        starred=starred,
        min_length=sum(len(p) for p in parts),
        _head_word=re.compile(head if starred else head + r"(?!\w)", flags),
        _tail_word=re.compile(tail, flags),
    )


_compile_cached = lru_cache(maxsize=4096)(_compile)
