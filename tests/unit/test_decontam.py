"""decontam.py on hand-made cases: n-grams, coverage, short exact matches, boilerplate vs edited copies."""

from __future__ import annotations

import pytest

from retool_cli.data.decontam import (
    BenchmarkIndex,
    flagged,
    ngram_hashes,
    ngrams,
    normalize,
    number_precision,
    openr1_flags,
)

BENCH = [
    "Let $x$ and $y$ be real numbers such that $x + y = 17$ and $xy = 60$. "
    "Find the value of $x^2 + y^2$ for these numbers.",
    "A fair coin is tossed repeatedly until either three consecutive heads appear or two consecutive tails appear. "
    "The probability that the process ends with the heads is $\\frac{m}{n}$, where $m$ and $n$ are relatively prime "
    "positive integers. Find $m+n$.",
    "Compute $\\dbinom{9}{4}$.",  # shorter than n words: only the exact match can see it
]


def test_normalize_and_ngrams() -> None:
    assert normalize("  Find  $\\frac{1}{2}$, NOW!") == "find 1 2 now"
    assert normalize("Find $x$.", latex=False, punctuation=False) == "find $x$."
    assert ngrams(["a", "b", "c", "d"], 2) == {"a b", "b c", "c d"}
    assert ngrams(["a", "b"], 3) == set()


def test_coverage_and_best_item() -> None:
    index = BenchmarkIndex(BENCH, n=3)
    [copy, unrelated] = index.overlaps([BENCH[0], "An entirely different question about geometry and circles."])
    assert copy.item == 0 and copy.coverage == 1.0 and copy.shared == index.sizes[0]
    assert unrelated.item == -1 and unrelated.shared == 0 and unrelated.coverage == 0.0


def test_repeated_ngrams_count_once_and_chunks_do_not_matter() -> None:
    index = BenchmarkIndex(BENCH, n=3)
    rows = [BENCH[0] + " " + BENCH[0], "unrelated words here", BENCH[1][:120], BENCH[0]]
    whole = index.overlaps(rows)
    assert whole[0].shared == index.sizes[0] and whole[0].coverage == 1.0  # each shared 3-gram once
    assert whole[2].item == 1 and 0 < whole[2].coverage < 1
    assert index.overlaps(rows, chunk_rows=1, threads=1) == whole == index.overlaps(rows, chunk_rows=3)


def test_short_problem_exact_match() -> None:
    index = BenchmarkIndex(BENCH, n=8)
    [hit, miss] = index.overlaps(["compute   $\\dbinom{9}{4}$ .", "Compute $\\dbinom{9}{5}$."])
    assert hit.exact and hit.item == 2 and flagged(hit, "coverage", 0.25)
    assert not miss.exact and not flagged(miss, "coverage", 0.25)


def test_numbers_decide_between_boilerplate_and_copies() -> None:
    boilerplate = (
        "A bag holds 4 red and 7 blue marbles. The chance of drawing two reds is $\\frac{m}{n}$, where $m$ "
        "and $n$ are relatively prime positive integers. Find $m+n$."
    )
    edited = (
        "Problem: Let $x$ and $y$ be two numbers so that $x + y = 17$ and also $xy = 60$. Find the value "
        "of $x^2 + y^2$."
    )
    index = BenchmarkIndex(BENCH, n=3)
    [b, e] = index.overlaps([boilerplate, edited])
    assert b.item == 1 and b.shared >= 3  # shares the boilerplate phrase...
    assert number_precision(boilerplate, BENCH[1]) == 0.0  # ...but none of its numbers
    assert not flagged(b, "coverage", 0.25, number_precision(boilerplate, BENCH[b.item]))
    assert e.item == 0 and number_precision(edited, BENCH[0]) == 1.0
    assert flagged(e, "coverage", 0.25, number_precision(edited, BENCH[e.item]))
    # open-r1's rule flags the boilerplate row: one shared 8-gram is enough
    assert BenchmarkIndex(BENCH, n=8).overlaps([boilerplate])[0].shared > 0 and openr1_flags([boilerplate], BENCH) == [
        True
    ]


def test_any_rule_matches_openr1() -> None:
    rows = [BENCH[0][:60] + " and more words here to follow", "nothing shared at all with anything", BENCH[1]]
    ours = [o.shared > 0 for o in BenchmarkIndex(BENCH, 8, latex=False, punctuation=False).overlaps(rows)]
    assert ours == openr1_flags(rows, BENCH) == [True, False, True]


def test_unknown_rule() -> None:
    with pytest.raises(ValueError, match="unknown decontamination rule"):
        flagged(BenchmarkIndex(BENCH, 3).overlaps(["x"])[0], "fuzzy", 0.5)


def test_byte_level_words_split_and_hash_like_python() -> None:
    """The compiled word split sees what `text.lower().split()` sees: Unicode and ASCII-control whitespace (every
    character Python calls whitespace), non-ASCII letters, control bytes that are not whitespace, words longer
    than 8 and 16 bytes."""
    spaces = [chr(c) for c in range(0x3001) if chr(c).isspace()]
    rows = [
        "".join(f"w{i}{space}" for i, space in enumerate(spaces)) + "end",
        "Alpha\u00a0beta\u3000GAMMA\tdelta\x1cepsilon",  # NBSP, ideographic space, tab, file separator
        "ÉCOLE naïve ŞEHİR x\x01y x\x7fy x\x00y",  # non-ASCII upper case; \x01 and NUL are not whitespace
        "abcdefgh abcdefghi abcdefghijklmnopq abcdefghijklmnopr",  # 8, 9, 17 bytes; differ only in the 17th
        "",
        "   ",
    ]
    ids, owners, per_row = ngram_hashes(rows, 1, latex=False, punctuation=False)
    words = [w for r in rows for w in r.lower().split()]
    assert per_row.tolist() == [len(r.lower().split()) for r in rows]
    assert owners.tolist() == [i for i, r in enumerate(rows) for _ in r.lower().split()]
    # Same word, same id; different words, different ids.
    by_word: dict[str, int] = {}
    for word, word_id in zip(words, ids.tolist(), strict=True):
        assert by_word.setdefault(word, word_id) == word_id
    assert len(set(by_word.values())) == len(by_word)


def test_any_rule_matches_openr1_on_unicode_and_long_words() -> None:
    bench = ["the quick brown fox jumps over the lazy dog near the riverbank_with_a_very_long_token today"]
    rows = [
        "THE\u00a0QUICK brown fox jumps over the lazy dog",  # Unicode space, upper case: same 8-gram
        "quick brown fox jumps over the lazy dog near",  # shifted: shares 8-grams
        "lazy dog near the riverbank_with_a_very_long_tokem today and more",  # the long token differs at its end
        "the quick brown fox jumps over the lazy",  # exactly one 8-gram
        "the quick brown fox jumps over the",  # 7 words
    ]
    ours = [o.shared > 0 for o in BenchmarkIndex(bench, 8, latex=False, punctuation=False).overlaps(rows, chunk_rows=2)]
    assert ours == openr1_flags(rows, bench) == [True, True, False, True, False]
