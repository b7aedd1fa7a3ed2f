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
    verdicts,
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
    assert number_precision(boilerplate, BENCH[1]) is None  # ...the item has no numbers to share...
    assert not flagged(b, "coverage", 0.25, None, words=index.word_coverage(boilerplate, 1))  # ...nor its words
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


# ------------------------------------------------------------------ heavier rewording, short copies, clean rows
# Problems in the style of the benchmarks (written here), edited as contaminated rows are: a quarter of the words
# replaced by filler (numbers kept), sentences reordered, both; short problems copied verbatim.
ITEMS = [
    "Four distinct circles are drawn in a plane. What is the maximum number of points where at least two of the "
    "circles intersect?",  # no numbers: the words decide
    "Paul and Jesse each choose a number at random from the first six primes. What is the probability that the "
    "sum of the numbers they choose is even?",
    "A rectangular box has volume 216 and surface area 240. The sum of the lengths of its twelve edges is 84. "
    "Find the length of the longest diagonal of the box.",
    "Determine the number of ways to arrange the letters of the word ELLIPSE.",
    "Simplify $\\sqrt{242}$.",  # 3 words: one 3-gram, fewer than min_shared
    "Evaluate $\\log_264$.",  # 2 words: no 3-gram at all
    "Compute $\\dbinom{31}{28}$.",
]
QUARTER_REPLACED = [
    "Four the circles are given in a plane. What is a maximum number of points such at least two of each "
    "circles intersect?",  # 5 of 21 words replaced
    "Paul and Jesse each choose the number at random from the first six primes. What is the value that the sum "
    "of the numbers they let is given?",
    "A rectangular box has volume 216 and the area 240. The sum of a lengths of its twelve edges is 84. Find "
    "the length of the longest value of the each.",
]
REORDERED = [
    "What is the maximum number of points where at least two of the circles intersect? Four distinct circles "
    "are drawn in a plane.",
    "Find the length of the longest diagonal of the box. The sum of the lengths of its twelve edges is 84. A "
    "rectangular box has volume 216 and surface area 240.",
]
SHORT_COPIES = [
    "Simplify $\\sqrt{242}$.",
    "Please solve: Simplify $\\sqrt{242}$. Show your steps.",
    "Evaluate $\\log_264$.",
    "Here is one: Evaluate $\\log_264$ and explain.",
    "Compute $\\dbinom{31}{28}$.",
]
CLEAN = [
    "How many ways are there to arrange the letters of the word BANANA in which the three A's are not adjacent?",
    "Evaluate the following expression: 0 + 1 + 2 + 3 + 4 + 5 + 6 + 7 + 8 + ... + 2000, where the terms with "
    "minus signs are exactly the powers of two.",
    "Two distinct lines are drawn in a plane. What is the probability that a random point is closer to the first?",
    "A box holds 12 red and 9 blue balls. What is the probability that two balls drawn at random are both red?",
    "Simplify $\\sqrt{243}$ and give the answer in simplest radical form.",
]


def coverage_flags(rows: list[str]) -> list[bool]:
    return [v.flagged for v in verdicts(BenchmarkIndex(ITEMS, 3, contained=True), rows, ITEMS, "coverage")]


def test_a_quarter_of_the_words_replaced_is_caught_with_or_without_numbers() -> None:
    assert coverage_flags(QUARTER_REPLACED) == [True, True, True]
    index = BenchmarkIndex(ITEMS, 3)
    first = index.overlaps(QUARTER_REPLACED[:1])[0]
    assert first.item == 0 and first.coverage < 0.5  # its 3-grams broke: the words (no numbers) caught it
    assert index.word_coverage(QUARTER_REPLACED[0], 0) >= 0.7


def test_reordered_sentences_are_caught() -> None:
    assert coverage_flags(REORDERED) == [True, True]


def test_short_problems_copied_verbatim_alone_or_inside_a_row() -> None:
    assert coverage_flags(SHORT_COPIES) == [True] * len(SHORT_COPIES)
    # without `contained`, a 2-word problem is seen only as a whole row
    plain = BenchmarkIndex(ITEMS, 3).overlaps(SHORT_COPIES[2:4])
    assert plain[0].exact and not plain[1].exact


def test_clean_rows_of_the_same_style_stay() -> None:
    """A sibling of a template problem (another word to arrange), a run of small numbers, a shared opening,
    a near-identical short problem with another number: none is a copy."""
    assert coverage_flags(CLEAN) == [False] * len(CLEAN)
