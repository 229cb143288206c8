"""The glob matcher (:mod:`roomstream.glob`) against the naive recursive definition of
the grammar, and its cost on patterns that make a backtracking matcher explode."""

from __future__ import annotations

import re
from functools import cache

from hypothesis import example, given, settings
from hypothesis import strategies as st

from roomstream import glob
from roomstream.glob import compile_glob


@cache
def _char_equal(p: str, c: str, ignore_case: bool) -> bool:
    if p == c:
        return True
    # Case-insensitive equality of one character as Python's re defines it (the oracle
    # tests the matcher's segmenting and placement, not Unicode case folding).
    return ignore_case and re.fullmatch(re.escape(p), c, re.IGNORECASE) is not None


def naive_full(pattern: str, value: str, wildcards: str, ignore_case: bool) -> bool:
    """The grammar, as written: ``*`` any run, ``?`` one character, anything else itself."""

    @cache
    def go(i: int, j: int) -> bool:
        if i == len(pattern):
            return j == len(value)
        p = pattern[i]
        if p == "*" and "*" in wildcards:
            return go(i + 1, j) or (j < len(value) and go(i, j + 1))
        if j == len(value):
            return False
        if p == "?" and "?" in wildcards:
            return go(i + 1, j + 1)
        return _char_equal(p, value[j], ignore_case) and go(i + 1, j + 1)

    return go(0, 0)


def _word(c: str) -> bool:
    return re.fullmatch(r"\w", c) is not None


def naive_words(pattern: str, value: str, wildcards: str, ignore_case: bool) -> bool:
    """Some value[s:e] matches whole, with s at the start or after a non-word character
    and e at the end or before one."""
    n = len(value)
    return any(
        naive_full(pattern, value[s:e], wildcards, ignore_case)
        for s in range(n + 1)
        if s == 0 or not _word(value[s - 1])
        for e in range(s, n + 1)
        if e == n or not _word(value[e])
    )


ALPHABET = st.sampled_from(
    ["a", "b", "A", "*", "?", " ", ".", "\n", "é", "É", "_", "\u017f", "s"]
)  # long s: folds to s
patterns = st.text(ALPHABET, max_size=8)
values = st.text(
    st.sampled_from(["a", "b", "A", " ", ".", "\n", "é", "É", "_", "*", "?", "S"]), max_size=12
)
options = st.sampled_from([("*", False), ("*?", True), ("", True), ("*?", False)])


@settings(max_examples=1500, deadline=None)
@given(patterns, values, options)
@example("a*a*b", "aaaa", ("*", False))
@example("*", "", ("*", False))
@example("a?", "A\n", ("*?", True))
def test_matches_is_the_grammar(pattern: str, value: str, option: tuple[str, bool]) -> None:
    wildcards, ignore_case = option
    compiled = compile_glob(pattern, wildcards=wildcards, ignore_case=ignore_case)
    assert compiled.matches(value) == naive_full(pattern, value, wildcards, ignore_case)


@settings(max_examples=1000, deadline=None)
@given(patterns, values, options)
@example("", "a ", ("*?", True))
@example("a*", "b a", ("*?", True))
@example("*a", "ab a_", ("*?", True))
def test_search_words_is_the_grammar(pattern: str, value: str, option: tuple[str, bool]) -> None:
    wildcards, ignore_case = option
    compiled = compile_glob(pattern, wildcards=wildcards, ignore_case=ignore_case)
    assert compiled.search_words(value) == naive_words(pattern, value, wildcards, ignore_case)


class _CountingExpression:
    """A segment expression that counts the characters its searches may examine."""

    def __init__(self, inner: re.Pattern[str], counter: list[int]) -> None:
        self.inner = inner
        self.counter = counter

    def _count(self, value: str, pos: int) -> None:
        self.counter[0] += (len(value) - pos + 1) * max(1, len(self.inner.pattern))

    def match(self, value: str, pos: int = 0) -> re.Match[str] | None:
        self._count(value, pos)
        return self.inner.match(value, pos)

    def fullmatch(self, value: str, pos: int = 0) -> re.Match[str] | None:
        self._count(value, pos)
        return self.inner.fullmatch(value, pos)

    def search(self, value: str, pos: int = 0) -> re.Match[str] | None:
        self._count(value, pos)
        return self.inner.search(value, pos)


def test_a_thousand_wildcards_cost_at_most_pattern_times_value() -> None:
    """Each segment search is quantifier-free, so it examines at most (rest of the value
    x its expression) characters; summed over the segments that is bounded by value
    length x pattern length, here some millions of steps, where a backtracking matcher
    tries every split of the value between the stars (astronomically many)."""
    pattern = "a*" * 1000 + "b"
    value = "a" * 5000
    compiled = compile_glob(pattern)
    assert len(compiled.segments) == 1001
    counter = [0]
    counted = glob.Glob(
        pattern=compiled.pattern,
        segments=tuple(
            glob._Segment(_CountingExpression(s.expression, counter), s.length)  # type: ignore[arg-type]
            for s in compiled.segments
        ),
        starred=compiled.starred,
        min_length=compiled.min_length,
        _head_word=compiled._head_word,
        _tail_word=compiled._tail_word,
    )
    assert counted.matches(value) is False
    assert counted.matches("a" * 4999 + "b") is True
    assert 0 < counter[0] <= 2 * len(value) * len(pattern) * 4  # escaped chars: <= 4 each
    assert compile_glob("*" * 1000 + "b").matches("a" * 100_000) is False
    assert (
        compile_glob("a*" * 1000 + "b", wildcards="*?", ignore_case=True).search_words("a " * 5000)
        is False
    )
