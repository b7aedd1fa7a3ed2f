"""Benchmark contamination: an index of the benchmarks' word n-grams and an overlap report per training row.

    text --normalize--> words --hash each n-gram (numpy, all rows at once)--> look up in the benchmark index
      --> per row: the benchmark item it shares most n-grams with, the count, coverage = shared / item's n-grams

Rules: `any` (one shared n-gram: open-r1's rule), `coverage` (coverage >= threshold), plus a normalised exact
match for benchmark problems shorter than n words (no n-gram rule can see those). Competition boilerplate
("where m and n are relatively prime positive integers") shares an 8-gram with many unrelated problems, so
`any` over-flags; `coverage` with a small n catches lightly edited copies while ignoring one shared phrase.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

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


# The characters beyond ASCII that str.split() splits on, as UTF-8: replaced by as many ASCII spaces.
_UNICODE_SPACES = [0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000]
_UNICODE_SPACE = re.compile(b"|".join(re.escape(chr(c).encode()) for c in _UNICODE_SPACES))


def _encode(text: str, latex: bool, punctuation: bool) -> bytes:
    data = _fold(text, latex, punctuation).encode()
    return data if data.isascii() else _UNICODE_SPACE.sub(lambda m: b" " * len(m.group()), data)


def ngrams(words: list[str], n: int) -> set[str]:
    return {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)}


# ------------------------------------------------------------------ vectorised n-gram hashing
# Turning millions of words into Python strings and hashing them one by one is what makes the plain method
# slow. Instead every text is encoded into one byte buffer and the words are found and hashed with numpy:
# word boundaries where bytes <= 32 (whitespace) start or stop, each word's bytes read eight at a time through an
# unaligned 8-byte view and mixed (splitmix64), n-grams combined from the word hashes.

_MULT = np.uint64(0x9E3779B97F4A7C15)
# Whitespace to str.split() in ASCII is 9-13, 28-32: the bytes <= 32 except these control bytes.
_CONTROL = bytes(b for b in range(32) if b not in (9, 10, 11, 12, 13, 28, 29, 30, 31))
_LOW_BYTES = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [2**64 - 1], dtype=np.uint64)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every input bit affects every output bit."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _word_ids(texts: list[str], latex: bool, punctuation: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A 64-bit hash of every word of every normalised text, the row it belongs to, and the words per row."""
    if latex or punctuation:
        encoded = [_encode(t, latex, punctuation) for t in texts]
    else:  # open-r1's normalisation: ASCII rows need nothing before the byte-level pass
        encoded = [t.encode() if t.isascii() else _encode(t, False, False) for t in texts]
    data = b" " + b" ".join(encoded).lower() + b" " * 9  # bytes.lower(): ASCII letters only, fast
    buffer = np.frombuffer(data, dtype=np.uint8)
    space = buffer <= 32
    if len(data.translate(None, _CONTROL)) != len(data):  # rare: control bytes that are not whitespace
        space[np.isin(buffer, np.frombuffer(_CONTROL, dtype=np.uint8))] = False
    edges = np.flatnonzero(space[1:] != space[:-1]) + 1  # alternating word starts and ends
    starts, lengths = edges[0::2], edges[1::2] - edges[0::2]  # (W,)
    eight = np.ndarray((len(buffer) - 7,), dtype="<u8", buffer=data, strides=(1,))  # bytes i..i+7 as one int
    with np.errstate(over="ignore"):  # wrap-around multiplication is the hash
        ids = _mix((eight[starts] & _LOW_BYTES[np.minimum(lengths, 8)]) ^ (lengths.astype(np.uint64) * _MULT))
        long = np.flatnonzero(lengths > 8)
        offset = 8
        while len(long):  # words longer than 8 bytes: fold in their next 8 bytes
            chunk = eight[starts[long] + offset] & _LOW_BYTES[np.minimum(lengths[long] - offset, 8)]
            ids[long] = _mix(ids[long] ^ chunk)
            offset += 8
            long = long[lengths[long] > offset]
    # Where each row starts in `data`, and where the last one ends.
    row_starts = np.zeros(len(encoded) + 1, dtype=np.int64)
    row_starts[1:] = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)) + 1
    row_starts = np.cumsum(row_starts) + 1
    first_word = np.searchsorted(starts, row_starts)  # (R + 1,)
    words_per_row = np.diff(first_word)  # (R,)
    return ids, np.repeat(np.arange(len(texts)), words_per_row), words_per_row


def _ngram_hashes(ids: np.ndarray, rows: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """64-bit hashes of every n-gram that lies within one row, and that row."""
    if len(ids) < n:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
    count = len(ids) - n + 1
    h = np.zeros(count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):
            h ^= ids[k : k + count]
            h *= _MULT
            h += np.uint64(k + 1)
    same_row = rows[:count] == rows[n - 1 : n - 1 + count]
    return h[same_row], rows[:count][same_row]


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def number_precision(train: str, item: str) -> float:
    """Share of the training row's numbers (as a multiset) that also occur in the benchmark item: an edited or
    truncated copy keeps its numbers; a problem that only shares boilerplate does not. 0.0 without numbers
    (then only the text can decide)."""
    mine, theirs = _NUMBER.findall(train), _NUMBER.findall(item)
    if not mine:
        return 0.0
    pool = Counter(theirs)
    return sum(min(count, pool[n]) for n, count in Counter(mine).items()) / len(mine)


@dataclass(frozen=True)
class Overlap:
    item: int  # index of the benchmark item sharing the most n-grams (-1: none)
    shared: int  # distinct n-grams shared with it
    coverage: float  # shared / that item's distinct n-grams
    exact: bool  # normalised text equals a short benchmark item's


NO_OVERLAP = Overlap(-1, 0, 0.0, False)


class BenchmarkIndex:
    _FILTER_BITS = 22  # a 4M-slot presence table in front of the sorted index: most lookups stop there

    def __init__(self, texts: list[str], n: int = 8, latex: bool = True, punctuation: bool = True) -> None:
        self.n, self.latex, self.punctuation = n, latex, punctuation
        ids, rows, _ = _word_ids(texts, latex, punctuation)
        hashes, owners = _ngram_hashes(ids, rows, n)
        # Distinct (n-gram, item) pairs.
        pairs = np.unique(np.stack([hashes, owners.astype(np.uint64)], axis=1), axis=0)
        self.hashes, self.owners = pairs[:, 0], pairs[:, 1].astype(np.int64)  # sorted by hash
        self.sizes = np.bincount(self.owners, minlength=len(texts))  # distinct n-grams per item
        self.present = np.zeros(1 << self._FILTER_BITS, dtype=bool)
        self.present[self.hashes >> np.uint64(64 - self._FILTER_BITS)] = True
        normal = [normalize(t, latex, punctuation) for t in texts]
        # Items shorter than n words, which no n-gram can see: matched by their whole normalised text.
        self.short = {t: i for i, t in enumerate(normal) if len(t.split()) < n and t}

    def _hits(self, hashes: np.ndarray) -> np.ndarray:
        """Indices of the hashes that are in the index."""
        maybe = np.flatnonzero(self.present[hashes >> np.uint64(64 - self._FILTER_BITS)])
        left = np.minimum(np.searchsorted(self.hashes, hashes[maybe]), len(self.hashes) - 1)
        return maybe[self.hashes[left] == hashes[maybe]]

    def _shared_ngrams(self, texts: list[str], first: int) -> tuple[np.ndarray, np.ndarray]:
        """Distinct (shared n-gram hash, row + first) pairs of a chunk of rows, and the words per row."""
        ids, rows, words_per_row = _word_ids(texts, self.latex, self.punctuation)
        hashes, owners = _ngram_hashes(ids, rows, self.n)  # every n-gram of every row, vectorised
        hit = self._hits(hashes)
        return np.unique(
            np.stack([hashes[hit], (owners[hit] + first).astype(np.uint64)], axis=1), axis=0
        ), words_per_row

    def overlaps(self, texts: list[str], chunk_rows: int = 8192, threads: int = 2) -> list[Overlap]:
        """Per row: the benchmark item with the highest coverage (then most shared n-grams, then lowest index).
        Chunks keep the byte arrays in cache and memory bounded; numpy releases the GIL, so a second thread
        hashes one chunk while the first encodes the next."""
        starts = range(0, len(texts), chunk_rows)
        with ThreadPoolExecutor(max(1, threads)) as pool:
            chunks = list(
                pool.map(lambda first: self._shared_ngrams(texts[first : first + chunk_rows], first), starts)
            )
        # Distinct (shared n-gram, row) pairs.
        distinct = np.concatenate([c[0] for c in chunks]) if chunks else np.zeros((0, 2), dtype=np.uint64)
        words_per_row = [c[1] for c in chunks]
        # One (row, item) per distinct shared n-gram and each item that has it, counted per (row, item).
        low = np.searchsorted(self.hashes, distinct[:, 0], side="left")
        width = np.searchsorted(self.hashes, distinct[:, 0], side="right") - low
        at = np.repeat(low - np.cumsum(width) + width, width) + np.arange(width.sum())
        items_total = len(self.sizes)
        keys, shared = np.unique(np.repeat(distinct[:, 1].astype(np.int64), width) * items_total + self.owners[at],
                                 return_counts=True)  # fmt: skip
        rows, items = keys // items_total, keys % items_total
        coverage = shared / np.maximum(1, self.sizes[items])
        # Sorted by row, then coverage, shared count and lowest index: each row's best item comes last.
        order = np.lexsort((-items, shared, coverage, rows))
        best = order[np.append(rows[order][1:] != rows[order][:-1], True)] if len(order) else order
        exact = {}
        if self.short:  # rows shorter than n words may equal a short benchmark item
            for row in np.flatnonzero(np.concatenate(words_per_row) < self.n).tolist():
                item = self.short.get(normalize(texts[row], self.latex, self.punctuation))
                if item is not None:
                    exact[row] = item
        out = [NO_OVERLAP] * len(texts)
        for row, item, count, cover in zip(rows[best].tolist(), items[best].tolist(), shared[best].tolist(),
                                           coverage[best].tolist(), strict=True):  # fmt: skip
            out[row] = Overlap(item, count, cover, row in exact)
        for row, item in exact.items():
            if out[row] is NO_OVERLAP:
                out[row] = Overlap(item, 0, 1.0, True)
        return out


def flagged(overlap: Overlap, rule: str, threshold: float, numbers: float = 0.0, min_shared: int = 3,
            text_only_threshold: float = 0.5) -> bool:  # fmt: skip
    """`any`: one shared n-gram. `coverage`: at least `threshold` of the item's n-grams (and `min_shared` of them)
    with the row's numbers found in the item (`numbers` = number_precision), or `text_only_threshold` of the
    item's n-grams whatever the numbers. A normalised exact match of a short item is always flagged."""
    if overlap.exact:
        return True
    if rule == "any":
        return overlap.shared > 0
    if rule == "coverage":
        if overlap.shared < min_shared:
            return False
        return (overlap.coverage >= threshold and numbers >= 0.8) or overlap.coverage >= text_only_threshold
    raise ValueError(f"unknown decontamination rule {rule!r} (any, coverage)")


def openr1_flags(train: list[str], benchmark: list[str], n: int = 8) -> list[bool]:
    """open-r1's method, written plainly for comparison: lowercase + whitespace words, a set of benchmark
    n-gram strings, a dict lookup per training n-gram."""
    index: set[str] = set()
    for text in benchmark:
        index |= ngrams(text.lower().split(), n)
    return [any(g in index for g in ngrams(t.lower().split(), n)) for t in train]
