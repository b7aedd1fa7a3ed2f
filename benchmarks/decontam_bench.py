"""Decontamination: speed against open-r1's method (re-implemented plainly: per-row n-gram sets, dict
lookups) on a synthetic 100k-row training set against aime24 + aime25 + math500, with identical flags under
the `any` rule; then recall of the rules on a labelled set of edited benchmark copies (200 problems drawn with
a fixed seed; words replaced by filler words with the numbers kept, sentences reordered, both, truncated, a
prefix added; every problem of at most 12 words copied verbatim, alone and inside a longer row) and false
positives on the 176 real DAPO rows of ../shared/data (none of them a benchmark problem).

    python benchmarks/decontam_bench.py [--rows 100000] [--rounds 5] [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import time
from pathlib import Path

from retool_cli.data.decontam import BenchmarkIndex, normalize, openr1_flags, verdicts

sys.path.insert(0, str(Path(__file__).parent))
from results import add_json_out, paired_ratios, spread, write

FILLER = [
    "the",
    "a",
    "of",
    "to",
    "and",
    "number",
    "value",
    "find",
    "given",
    "let",
    "each",
    "which",
    "point",
    "such",
    "that",
]


def load(data: Path, name: str, field: str = "problem") -> list[str]:
    return [json.loads(line)[field] for line in (data / name).read_text().splitlines()]


def training_set(bench: list[str], dapo: list[str], rows: int, rng: random.Random) -> list[str]:
    """Rows stitched from DAPO sentences and random numbers; 1% carry a 10-word span of a benchmark problem."""
    sentences = [s.strip() for text in dapo for s in text.split(".") if len(s.split()) > 3]
    out = []
    for i in range(rows):
        text = ". ".join(rng.sample(sentences, 2)) + f" {rng.randint(1, 999)}."
        if i % 100 == 0:
            words = rng.choice(bench).split()
            start = rng.randint(0, max(0, len(words) - 10))
            text += " " + " ".join(words[start : start + 10])
        out.append(text)
    return out


def edited_copies(bench: list[str], rng: random.Random, per_kind: int = 200) -> dict[str, list[tuple[str, int]]]:
    def edit(text: str, frac: float) -> str:
        words = text.split()
        editable = [i for i, w in enumerate(words) if not any(c.isdigit() for c in w)]  # numbers unchanged
        for i in rng.sample(editable, int(frac * len(editable))):
            words[i] = rng.choice(FILLER)
        return " ".join(words)

    def reorder(text: str) -> str | None:
        sentences = [s for s in re.split(r"(?<=[.?!])\s+", text.strip()) if s]
        shuffled = sentences[::-1]  # reversed: another order for any problem of several sentences
        return " ".join(shuffled) if len(sentences) > 1 else None

    items = rng.sample(range(len(bench)), per_kind)
    kinds = {
        f"{int(100 * f)}% words changed": [("Problem: " + edit(bench[i], f), i) for i in items]
        for f in (0.1, 0.2, 0.25, 0.3, 0.4)
    }
    kinds["sentences reordered"] = [(t, i) for i in items if (t := reorder(bench[i]))]
    kinds["25% changed + reordered"] = [(t, i) for i in items if (t := reorder(edit(bench[i], 0.25)))]
    kinds["truncated to 70%"] = [(" ".join(bench[i].split()[: int(0.7 * len(bench[i].split()))]), i) for i in items]
    kinds["prefix added"] = [("Here is a competition question. " + bench[i], i) for i in items]
    short = [i for i, text in enumerate(bench) if len(normalize(text).split()) <= 12]
    kinds["short, verbatim"] = [(bench[i], i) for i in short]
    kinds["short, inside a row"] = [(f"Solve this: {bench[i]} Show your work.", i) for i in short]
    return kinds


def rule_flags(texts: list[str], bench: list[str], rule: str) -> list[bool]:
    """The rule as `retool decontaminate` applies it with its defaults."""
    if rule == "any":
        return [o.shared > 0 for o in BenchmarkIndex(bench, 8).overlaps(texts)]
    return [v.flagged for v in verdicts(BenchmarkIndex(bench, 3, contained=True), texts, bench, "coverage")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    add_json_out(parser)
    args = parser.parse_args()
    rng = random.Random(0)
    bench = load(args.data, "aime24.jsonl") + load(args.data, "aime25.jsonl") + load(args.data, "math500.jsonl")
    dapo = load(args.data, "dapo_sample.jsonl")
    train = training_set(bench, dapo, args.rows, rng)

    plain_s, ours_s = [], []
    # untimed: loading the compiled scan from numba's disk cache (~0.3 s) is once per process, not per index
    BenchmarkIndex(bench, 8, latex=False, punctuation=False).overlaps(train[:100])
    for _ in range(args.rounds):  # alternating, so both see the same machine load; both build their index
        started = time.perf_counter()
        plain = openr1_flags(train, bench, 8)
        plain_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        index = BenchmarkIndex(bench, 8, latex=False, punctuation=False)  # open-r1's normalisation
        ours = [o.shared > 0 for o in index.overlaps(train)]
        ours_s.append(time.perf_counter() - started)
    plain_med, ours_med = statistics.median(plain_s), statistics.median(ours_s)
    print(f"{len(train)} rows x {len(bench)} benchmark problems, `any` rule, n=8, median of {args.rounds} rounds")
    print(f"open-r1 method: {plain_med:6.2f} s   ours: {ours_med:6.2f} s   speed-up {plain_med / ours_med:.1f}x")
    speedup = paired_ratios(plain_s, ours_s)
    print(f"speed-up per round: {speedup['min']:.1f}-{speedup['max']:.1f}x")
    print(f"flags: open-r1 {sum(plain)}, ours {sum(ours)}, identical: {plain == ours}")
    quantities: dict[str, object] = {"rows": len(train), "openr1_s": spread(plain_s), "ours_s": spread(ours_s)}
    checks = {"flags_identical": plain == ours, "flags": sum(ours)}

    print("\nrecall on edited benchmark copies and false positives on 176 real DAPO rows:")
    kinds = edited_copies(bench, rng)
    for rule in ("any", "coverage"):
        line = f"  rule={rule:<9}"
        caught = total = 0
        for name, rows in kinds.items():
            hits = sum(rule_flags([t for t, _ in rows], bench, rule))
            caught, total = caught + hits, total + len(rows)
            line += f" {name}: {hits}/{len(rows)};"
        false_pos = sum(rule_flags(dapo, bench, rule))
        # clean rows of competition style: each benchmark's problems against the other benchmarks' index
        aime, math500 = bench[:60], bench[60:]
        cross = sum(rule_flags(math500, aime, rule)) + sum(rule_flags(aime, math500, rule))
        precision = caught / max(1, caught + false_pos)
        quantities |= {f"{rule}/recall": caught / total, f"{rule}/dapo_flagged": false_pos}
        quantities[f"{rule}/cross_flagged"] = cross
        print(
            f"{line}\n    recall {caught / total:.1%}, DAPO rows flagged {false_pos}/176 ({false_pos / 176:.1%}), "
            f"precision {precision:.1%}; math500 rows against aime and aime rows against math500 flagged {cross}/560"
        )

    write(args.json_out, "decontam", quantities, {"speedup_openr1_s_over_ours_s": speedup}, checks)


if __name__ == "__main__":
    main()
