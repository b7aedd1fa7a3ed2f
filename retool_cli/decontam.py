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
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np

_LATEX = re.compile(r"\\(?:left|right|displaystyle|mathrm|text|textbf|dfrac|tfrac|frac|cdot|times)|[\\{}$]")
_PUNCT = re.compile(r"[^\w\s]")


def normalize(text: str, latex: bool = True, punctuation: bool = True) -> str:
    """Lowercase and collapse whitespace (open-r1), optionally fold LaTeX markup and punctuation away."""
    text = unicodedata.normalize("NFKC", text).lower()
    if latex:
        text = _LATEX.sub(" ", text)
    if punctuation:
        text = _PUNCT.sub(" ", text)
    return " ".join(text.split())


def ngrams(words: list[str], n: int) -> set[str]:
    return {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)}


# ------------------------------------------------------------------ vectorised n-gram hashing

_MULT = np.uint64(0x9E3779B97F4A7C15)


def _word_ids(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Every word of every text as a 64-bit id (Python's string hash: stable within a process, which is
    where the index lives) and the row it belongs to."""
    words: list[str] = []
    lengths = []
    for text in texts:
        split = text.split()
        words.extend(split)
        lengths.append(len(split))
    ids = np.fromiter(map(hash, words), dtype=np.int64, count=len(words)).view(np.uint64)
    return ids, np.repeat(np.arange(len(texts), dtype=np.int64), lengths)


def _ngram_hashes(ids: np.ndarray, rows: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """64-bit hashes of every n-gram that lies within one row, and that row."""
    if len(ids) < n:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
    count = len(ids) - n + 1
    h = np.zeros(count, dtype=np.uint64)
    with np.errstate(over="ignore"):  # wrap-around multiplication is the hash
        for k in range(n):
            h = (h ^ ids[k : k + count]) * _MULT + np.uint64(k + 1)
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


@dataclass
class Overlap:
    item: int  # index of the benchmark item sharing the most n-grams (-1: none)
    shared: int  # distinct n-grams shared with it
    coverage: float  # shared / that item's distinct n-grams
    exact: bool  # normalised text equals a short benchmark item's


class BenchmarkIndex:
    def __init__(self, texts: list[str], n: int = 8, latex: bool = True, punctuation: bool = True) -> None:
        self.n, self.latex, self.punctuation = n, latex, punctuation
        normal = [normalize(t, latex, punctuation) for t in texts]
        ids, rows = _word_ids(normal)
        hashes, owners = _ngram_hashes(ids, rows, n)
        pairs = np.unique(
            np.stack([hashes, owners.astype(np.uint64)], axis=1), axis=0
        )  # distinct (ngram, item)
        self.hashes, self.owners = pairs[:, 0], pairs[:, 1].astype(np.int64)  # sorted by hash
        self.sizes = np.bincount(self.owners, minlength=len(texts))  # distinct n-grams per item
        self.short = {
            t: i for i, t in enumerate(normal) if len(t.split()) < n and t
        }  # n-gram rules cannot see these

    def overlaps(self, texts: list[str]) -> list[Overlap]:
        normal = [normalize(t, self.latex, self.punctuation) for t in texts]
        ids, rows = _word_ids(normal)
        hashes, owners = _ngram_hashes(ids, rows, self.n)  # every n-gram of every row, vectorised
        # Look every n-gram up at once; only the (rare) hits reach Python.
        left = np.searchsorted(self.hashes, hashes, side="left")
        hit = (left < len(self.hashes)) & (self.hashes[np.minimum(left, len(self.hashes) - 1)] == hashes)
        pairs = np.unique(np.stack([hashes[hit], owners[hit].astype(np.uint64)], axis=1), axis=0)
        counts: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        lows = np.searchsorted(self.hashes, pairs[:, 0], side="left")
        highs = np.searchsorted(self.hashes, pairs[:, 0], side="right")
        for row, lo, hi in zip(pairs[:, 1].tolist(), lows.tolist(), highs.tolist(), strict=True):
            for item in self.owners[lo:hi]:
                counts[int(row)][int(item)] += 1
        out = []
        for row, text in enumerate(normal):
            exact = text in self.short
            if row in counts:
                item, shared = max(
                    counts[row].items(), key=lambda kv: (kv[1] / max(1, self.sizes[kv[0]]), kv[1])
                )
                out.append(Overlap(item, shared, shared / max(1, int(self.sizes[item])), exact))
            else:
                out.append(Overlap(self.short[text] if exact else -1, 0, 1.0 if exact else 0.0, exact))
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
        index |= ngrams(normalize(text, latex=False, punctuation=False).split(), n)
    return [
        any(g in index for g in ngrams(normalize(t, latex=False, punctuation=False).split(), n))
        for t in train
    ]
