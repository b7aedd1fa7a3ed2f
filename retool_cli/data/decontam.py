"""Benchmark contamination: an index of the benchmarks' word n-grams and an overlap report per training row.

    text --normalize--> words --hash each n-gram (one compiled pass per chunk of rows)--> look up in the index
      --> per row: the benchmark item it shares most n-grams with, the count, coverage = shared / item's n-grams

Rules: `any` (one shared n-gram: open-r1's rule), `coverage` (coverage >= threshold, see `flagged`), plus a
normalised exact match for benchmark problems shorter than n words (no n-gram rule can see those; with
`contained`, such a problem of two or more words copied anywhere inside a row). Competition boilerplate
("where m and n are relatively prime positive integers") shares an 8-gram with many unrelated problems, so
`any` over-flags; `coverage` with a small n catches edited copies (a quarter of the words replaced, sentences
reordered) while ignoring one shared phrase: numbers carry a problem's identity where it has some, the share
of its distinct words where it has none.
"""

from __future__ import annotations

import math
import operator
import re
import unicodedata
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from itertools import compress
from typing import NamedTuple

import numba
import numpy as np

_LATEX = re.compile(
    r"\\(?:left|right|displaystyle|mathrm|text|textbf|dfrac|tfrac|frac|cdot|times)|[\\{}$]", re.IGNORECASE
)
_PUNCT = re.compile(r"[^\w\s]")


def normalize(text: str, latex: bool = True, punctuation: bool = True) -> str:
    """Lowercase and collapse whitespace (open-r1); with LaTeX or punctuation folding, also NFKC-fold Unicode
    and drop LaTeX markup / punctuation."""
    return " ".join(_fold(text, latex, punctuation).lower().split())


def _fold(text: str, latex: bool, punctuation: bool) -> str:
    """`normalize` up to the lowercasing of ASCII letters and the whitespace collapse, which the byte-level
    word split below does for all rows at once."""
    if not text.isascii():
        text = (unicodedata.normalize("NFKC", text) if latex or punctuation else text).lower()
    if latex:
        text = _LATEX.sub(" ", text)
    if punctuation:
        text = _PUNCT.sub(" ", text)
    return text


def ngrams(words: list[str], n: int) -> set[str]:
    return {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)}


# ------------------------------------------------------------------ compiled n-gram hashing
# Turning millions of words into Python strings and hashing them one by one is what makes the plain method
# slow. Instead a chunk of rows is encoded into one byte buffer (each row ended by NUL) and one compiled function
# (numba) splits it into words as str.split() does, hashes each word (its bytes eight at a time, mixed with
# splitmix64's finaliser), combines each run of n words of a row into an n-gram hash and looks that up in the
# index.

_FILTER_BITS = 22  # a 4M-bit presence table in front of the sorted index: most lookups stop there
# What each byte is to the scan: part of a word, ASCII whitespace to str.split() (9-13, 28-32; the other
# control bytes belong to words), the row separator, or a lead byte of a multi-byte character that may be
# whitespace.
_WORD, _SPACE, _ROW_END, _MAYBE_SPACE = 0, 1, 2, 3
_KIND = np.zeros(256, dtype=np.uint8)
_KIND[[9, 10, 11, 12, 13, 28, 29, 30, 31, 32]] = _SPACE
_KIND[0] = _ROW_END
_KIND[[0xC2, 0xE1, 0xE2, 0xE3]] = _MAYBE_SPACE
_LOWER = np.arange(256, dtype=np.uint8)  # bytes.lower(): ASCII letters only (other rows were str.lower()ed)
_LOWER[65:91] += 32


@numba.njit(cache=True, nogil=True)
def _unicode_space(data: np.ndarray, i: int) -> int:
    """Length of the UTF-8 encoded non-ASCII whitespace character that starts at data[i] (U+0085, U+00A0,
    U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000: what str.split() splits on), else 0."""
    lead = data[i]
    if lead == 0xC2 and i + 1 < len(data):
        return 2 if data[i + 1] == 0x85 or data[i + 1] == 0xA0 else 0
    if i + 2 >= len(data):
        return 0
    second, third = data[i + 1], data[i + 2]
    if lead == 0xE2 and second == 0x80:
        return 3 if third <= 0x8A or third == 0xA8 or third == 0xA9 or third == 0xAF else 0
    matched = (lead == 0xE1 and second == 0x9A and third == 0x80) or (lead == 0xE2 and second == 0x81 and third == 0x9F)
    return 3 if matched or (lead == 0xE3 and second == 0x80 and third == 0x80) else 0


@numba.njit(cache=True, nogil=True)
def _scan(
    data: np.ndarray, rows: int, n: int, present: np.ndarray, index: np.ndarray, keep_all: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The n-grams of `rows` NUL-terminated rows in data (bytes,) uint8: every one (keep_all), or only those
    in the index (sorted hashes, with the presence table over their top bits). Returns their hashes (G,)
    uint64, their rows (G,), the words per row (rows,) and the number of rows seen (more than `rows` when a
    row held a NUL).

    Two loops: the first splits the bytes into words, packing a word's bytes eight to a 64-bit chunk and mixing
    each full chunk into its state; the second (no branch per byte, so the CPU overlaps the words) finishes
    each word's hash with its length (splitmix64's finaliser) and slides a window over each row's words: the
    n-gram hash is a polynomial in the word hashes (base M, mod 2^64) updated in O(1), then mixed."""
    states = np.empty(len(data) // 2 + 1, dtype=np.uint64)  # per word: its bytes' state, then its hash
    lengths = np.empty(len(data) // 2 + 1, dtype=np.uint64)
    per_row = np.zeros(rows, dtype=np.int64)
    words, row, start, length, i = 0, 0, 0, 0, 0
    h, chunk, shift = np.uint64(0), np.uint64(0), np.uint64(0)
    while i < len(data):
        byte = data[i]
        kind = _KIND[byte]
        width = 1
        if kind == _MAYBE_SPACE:
            width = max(1, _unicode_space(data, i))
            kind = _SPACE if width > 1 else _WORD
        i += width
        if kind == _WORD:
            chunk |= np.uint64(_LOWER[byte]) << shift
            shift += np.uint64(8)
            length += 1
            if shift == 64:
                h, chunk, shift = _mix(h ^ chunk), np.uint64(0), np.uint64(0)
            continue
        if length:  # a word ends
            states[words], lengths[words] = h ^ chunk, length
            words += 1
            h, chunk, shift, length = np.uint64(0), np.uint64(0), np.uint64(0), 0
        if kind == _ROW_END:
            if row < rows:
                per_row[row] = words - start
            row, start = row + 1, words
    base = np.uint64(0x9E3779B97F4A7C15)
    for w in range(words):
        states[w] = _mix(states[w] ^ (lengths[w] * base))
    oldest = np.uint64(1)  # base^n: the weight, after the update, of the word leaving the window
    for _ in range(n):
        oldest *= base
    hashes = np.empty(max(0, words - n + 1), dtype=np.uint64)
    owners = np.empty(max(0, words - n + 1), dtype=np.int64)
    found, first = 0, 0
    for r in range(min(row, rows)):
        window = np.uint64(0)
        for k in range(per_row[r]):
            window = window * base + states[first + k]
            if k >= n:
                window -= states[first + k - n] * oldest
            if k >= n - 1:
                g = _mix(window)
                bit = g >> np.uint64(64 - _FILTER_BITS)
                keep = keep_all
                if not keep_all and (present[bit >> np.uint64(3)] >> (bit & np.uint64(7))) & 1:
                    where = np.searchsorted(index, g)
                    keep = where < len(index) and index[where] == g
                if keep:
                    hashes[found], owners[found] = g, r
                    found += 1
        first += per_row[r]
    return hashes[:found], owners[:found], per_row, row


@numba.njit(cache=True, nogil=True)
def _mix(x: np.uint64) -> np.uint64:
    """splitmix64's finaliser: every input bit moves every output bit."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _scan_rows(
    texts: list[str], n: int, latex: bool, punctuation: bool, present: np.ndarray, index: np.ndarray, keep_all: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`_scan` over normalised texts: (n-gram hashes (G,), their rows (G,) in row order, words per row (R,)).

    The buffer holds the ASCII rows first, then the others (lowercased with str.lower(); the scan lowercases
    ASCII letters): joining and encoding all-ASCII text is a memory copy, while one non-ASCII row makes the
    whole joined string slow to build and encode. A NUL inside a row (rare) becomes 0xFF, a byte UTF-8 never
    uses: it stays part of its word, as in str.split(), and cannot be confused with any other text."""
    if latex or punctuation:
        texts = [_fold(t, latex, punctuation) for t in texts]  # non-ASCII rows come back lowercased
    is_ascii = list(map(str.isascii, texts))
    plain = list(compress(texts, is_ascii))
    others = list(compress(texts, map(operator.not_, is_ascii)))
    if not (latex or punctuation):
        others = list(map(str.lower, others))
    flags = np.array(is_ascii, dtype=np.bool_)
    order = np.concatenate([np.flatnonzero(flags), np.flatnonzero(~flags)])  # buffer row -> row
    data = b"".join("\x00".join([*group, ""]).encode() for group in (plain, others) if group)
    hashes, owners, per_row, seen = _scan(np.frombuffer(data, dtype=np.uint8), len(texts), n, present, index, keep_all)
    if seen != len(texts):  # a row held a NUL
        data = b"".join(t.encode().replace(b"\x00", b"\xff") + b"\x00" for t in plain + others)
        hashes, owners, per_row, _ = _scan(np.frombuffer(data, dtype=np.uint8), len(texts), n, present, index, keep_all)
    owners = order[owners]
    by_row = np.argsort(owners, kind="stable")  # a row's n-grams stay in text order
    words_per_row = np.empty_like(per_row)
    words_per_row[order] = per_row
    return hashes[by_row], owners[by_row], words_per_row


def ngram_hashes(
    texts: list[str], n: int, latex: bool = True, punctuation: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """64-bit hashes of every word n-gram of every normalised text (n = 1: of every word), their rows (in row
    order), and the words per row."""
    return _scan_rows(texts, n, latex, punctuation, np.zeros(1, np.uint8), np.zeros(1, np.uint64), True)


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def number_precision(train: str, item: str) -> float | None:
    """Share of the training row's numbers (as a multiset) that also occur in the benchmark item: an edited or
    truncated copy keeps its numbers; a problem that only shares boilerplate does not. None when the row or
    the item has no number (then only the text can decide)."""
    mine, theirs = _NUMBER.findall(train), _NUMBER.findall(item)
    if not mine or not theirs:
        return None
    pool = Counter(theirs)
    return sum(min(count, pool[n]) for n, count in Counter(mine).items()) / len(mine)


def _distinct(hashes: np.ndarray, owners: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (hash, owner) pairs, sorted by hash then owner (np.unique(axis=0) is 3x slower)."""
    order = np.lexsort((owners, hashes))
    hashes, owners = hashes[order], owners[order]
    keep = np.ones(len(hashes), dtype=np.bool_)
    keep[1:] = (hashes[1:] != hashes[:-1]) | (owners[1:] != owners[:-1])
    return hashes[keep], owners[keep]


class Overlap(NamedTuple):  # a tuple: thousands are made per call, and a frozen dataclass is slow to build
    item: int  # index of the benchmark item sharing the most n-grams (-1: none)
    shared: int  # distinct n-grams shared with it
    coverage: float  # shared / that item's distinct n-grams
    exact: bool  # normalised text equals a short benchmark item's


NO_OVERLAP = Overlap(-1, 0, 0.0, False)


class BenchmarkIndex:
    def __init__(
        self, texts: list[str], n: int = 8, latex: bool = True, punctuation: bool = True, contained: bool = False
    ) -> None:
        """`contained`: also find benchmark problems of 2 to n-1 words copied anywhere inside a row (each is
        its own only k-gram: one more scan per such length), not only as the whole row."""
        self.n, self.latex, self.punctuation = n, latex, punctuation
        hashes, owners, _ = ngram_hashes(texts, n, latex, punctuation)
        self.hashes, self.owners = _distinct(hashes, owners)  # (n-gram, item) pairs, sorted by hash
        self.sizes = np.bincount(self.owners, minlength=len(texts))  # distinct n-grams per item
        present = np.zeros(1 << _FILTER_BITS, dtype=np.bool_)
        present[self.hashes >> np.uint64(64 - _FILTER_BITS)] = True
        self.present = np.packbits(present, bitorder="little")  # one bit per slot: 512 KB, stays in cache
        normal = [normalize(t, latex, punctuation) for t in texts]
        self.words = [set(t.split()) for t in normal]
        # rare words weigh more: a template shared by many problems ("the letters of the word") weighs little
        frequency = Counter(w for words in self.words for w in words)
        self.weight = {w: math.log((len(texts) + 1) / count) for w, count in frequency.items()}
        # Items shorter than n words, which no n-gram can see: matched by their whole normalised text.
        self.short = {t: i for i, t in enumerate(normal) if len(t.split()) < n and t}
        self.contained: list[tuple[BenchmarkIndex, list[int]]] = []  # (index of the k-word items, their items)
        for k in range(2, n) if contained else ():
            items = [i for i, t in enumerate(normal) if len(t.split()) == k]
            if items:
                self.contained.append((BenchmarkIndex([texts[i] for i in items], k, latex, punctuation), items))

    def word_coverage(self, train: str, item: int) -> float:
        """The weighted share of item's distinct words that occur in the row (weights: each word's inverse
        document frequency over the benchmark). A copy with a quarter of its words replaced keeps about three
        quarters of them while its n-grams break (a 3-gram survives with 0.75^3); a problem of the same
        template keeps the common words but not the rare ones that make it another problem."""
        words = self.words[item]
        present = words & set(normalize(train, self.latex, self.punctuation).split())
        return sum(self.weight[w] for w in present) / max(1e-9, sum(self.weight[w] for w in words))

    def _shared_ngrams(self, texts: list[str], first: int) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
        """The shared n-grams of a chunk of rows (hashes (G,), rows + first (G,)), and the words per row."""
        hashes, owners, words_per_row = _scan_rows(
            texts, self.n, self.latex, self.punctuation, self.present, self.hashes, False
        )
        return (hashes, owners + first), words_per_row

    def overlaps(self, texts: list[str], chunk_rows: int = 2048, threads: int = 2) -> list[Overlap]:
        """Per row: the benchmark item with the highest coverage (then most shared n-grams, then lowest index).
        Chunks keep the byte arrays in cache and memory bounded; the scan releases the GIL, so a second thread
        scans one chunk while the first encodes the next."""
        return self.ranked(texts, chunk_rows, threads)[0]

    def ranked(
        self, texts: list[str], chunk_rows: int = 2048, threads: int = 2, ranks: tuple[str, ...] = ("coverage",)
    ) -> list[list[Overlap]]:
        """`overlaps` for each ranking of one scan: "coverage" (as `overlaps`) or "shared" (the most shared
        n-grams first: a long problem edited heavily can share more n-grams with a row than a short item of
        similar words, at a lower coverage). A row holding a short item (exact, or contained) names that item."""
        starts = range(0, len(texts), chunk_rows)
        with ThreadPoolExecutor(max(1, threads)) as pool:
            chunks = list(pool.map(lambda first: self._shared_ngrams(texts[first : first + chunk_rows], first), starts))
        if not chunks:
            return [[] for _ in ranks]
        # Distinct (shared n-gram, row) pairs: a row that repeats an n-gram counts it once.
        hashes, owners = _distinct(np.concatenate([c[0][0] for c in chunks]), np.concatenate([c[0][1] for c in chunks]))
        words_per_row = [c[1] for c in chunks]
        # One (row, item) per distinct shared n-gram and each item that has it, counted per (row, item).
        low = np.searchsorted(self.hashes, hashes, side="left")
        width = np.searchsorted(self.hashes, hashes, side="right") - low
        at = np.repeat(low - np.cumsum(width) + width, width) + np.arange(width.sum())
        items_total = len(self.sizes)
        keys, shared = np.unique(np.repeat(owners, width) * items_total + self.owners[at], return_counts=True)
        rows, items = keys // items_total, keys % items_total
        coverage = shared / np.maximum(1, self.sizes[items])
        exact = self._short_copies(texts, np.concatenate(words_per_row), chunk_rows, threads)
        out = []
        for rank in ranks:
            # Sorted by row, then the ranking's keys and lowest index: each row's best item comes last.
            sort_keys = (-items, shared, coverage, rows) if rank == "coverage" else (-items, coverage, shared, rows)
            order = np.lexsort(sort_keys)
            best = order[np.append(rows[order][1:] != rows[order][:-1], True)] if len(order) else order
            found = [NO_OVERLAP] * len(texts)
            for row, item, count, cover in zip(
                rows[best].tolist(), items[best].tolist(), shared[best].tolist(), coverage[best].tolist(), strict=True
            ):
                found[row] = Overlap(item, count, cover, False)
            for row, item in exact.items():
                found[row] = Overlap(item, found[row].shared if found[row].item == item else 0, 1.0, True)
            out.append(found)
        return out

    def _short_copies(
        self, texts: list[str], words_per_row: np.ndarray, chunk_rows: int, threads: int
    ) -> dict[int, int]:
        """row -> item for rows equal to a benchmark item shorter than n words, or (`contained`) holding one."""
        exact: dict[int, int] = {}
        if self.short:  # rows shorter than n words may equal a short benchmark item
            for row in np.flatnonzero(words_per_row < self.n).tolist():
                item = self.short.get(normalize(texts[row], self.latex, self.punctuation))
                if item is not None:
                    exact[row] = item
        for sub_index, sub_items in self.contained:  # a short item's only k-gram inside a row: its copy
            for row, found in enumerate(sub_index.overlaps(texts, chunk_rows, threads)):
                if found.shared and row not in exact:
                    exact[row] = sub_items[found.item]
        return exact


def flagged(
    overlap: Overlap,
    rule: str,
    threshold: float,
    numbers: float | None = None,
    min_shared: int = 3,
    text_only_threshold: float = 0.5,
    words: float = 0.0,
    item_ngrams: int | None = None,
    word_threshold: float = 0.7,
) -> bool:
    """`any`: one shared n-gram. `coverage`: at least `min_shared` of the item's n-grams (all of them for an item
    with fewer), and then
    - where row and item both have numbers (`numbers` = number_precision): the row's numbers found in the item
      (>= 0.8) and half of its words, with `threshold` of the item's n-grams or a rewording (below), or
      `text_only_threshold` of them with at least half of the numbers;
    - where either has none: `text_only_threshold` of the item's n-grams, or a rewording.
    A rewording: 0.6 x `threshold` of the item's n-grams and `word_threshold` of its distinct words (weighted:
    `words` = BenchmarkIndex.word_coverage): a copy with a quarter of its words replaced or its sentences
    reordered keeps its words while its 3-grams break.
    A normalised exact match of a short item (or, with `contained`, its copy inside a row) is always flagged."""
    if overlap.exact:
        return True
    if rule == "any":
        return overlap.shared > 0
    if rule == "coverage":
        if overlap.shared < min(min_shared, item_ngrams or min_shared):
            return False
        reworded = overlap.coverage >= 0.6 * threshold and words >= word_threshold  # words kept, n-grams broken
        if numbers is not None:  # the numbers and half the words (runs of small numbers alone are no copy)
            return (numbers >= 0.8 and words >= 0.5 and (overlap.coverage >= threshold or reworded)) or (
                overlap.coverage >= text_only_threshold and numbers >= 0.5
            )
        return overlap.coverage >= text_only_threshold or reworded
    raise ValueError(f"unknown decontamination rule {rule!r} (any, coverage)")


class Verdict(NamedTuple):
    overlap: Overlap  # the benchmark item the row overlaps most
    numbers: float | None  # number_precision against that item
    words: float  # weighted share of that item's words in the row (computed where the rule needs it, else 0.0)
    flagged: bool


def verdicts(
    index: BenchmarkIndex,
    texts: list[str],
    items: list[str],
    rule: str,
    threshold: float = 0.25,
    min_shared: int = 3,
    text_only_threshold: float = 0.5,
    word_threshold: float = 0.7,
) -> list[Verdict]:
    """Each row against the benchmark `index` was built from (`items`, its texts), by `rule` (see `flagged`):
    the item of highest coverage, and (coverage rule) the one sharing the most n-grams where that differs."""
    ranks = ("coverage", "shared") if rule == "coverage" else ("coverage",)
    found = index.ranked(texts, ranks=ranks)  # one scan, one or two rankings
    by_coverage, by_shared = found[0], found[-1]
    out = []
    for text, first, second in zip(texts, by_coverage, by_shared, strict=True):
        verdict: Verdict | None = None
        for o in (first, second) if second.item != first.item else (first,):
            if o.item < 0:
                verdict = Verdict(o, None, 0.0, flagged(o, rule, threshold))
                continue
            numbers = number_precision(text, items[o.item])
            words = index.word_coverage(text, o.item) if rule == "coverage" and o.coverage >= 0.5 * threshold else 0.0
            size = int(index.sizes[o.item])
            flag = flagged(o, rule, threshold, numbers, min_shared, text_only_threshold, words, size, word_threshold)
            if verdict is None or flag:
                verdict = Verdict(o, numbers, words, flag)
            if flag:
                break
        assert verdict is not None  # the loop ran at least once
        out.append(verdict)
    return out


def openr1_flags(train: list[str], benchmark: list[str], n: int = 8) -> list[bool]:
    """open-r1's method, written plainly for comparison: lowercase + whitespace words, a set of benchmark
    n-gram strings, a dict lookup per training n-gram."""
    index: set[str] = set()
    for text in benchmark:
        index |= ngrams(text.lower().split(), n)
    return [any(g in index for g in ngrams(t.lower().split(), n)) for t in train]
