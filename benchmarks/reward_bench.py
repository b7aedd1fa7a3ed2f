"""Judge throughput: ours (cache + exact fast path + killable math-verify workers) against plain
`math_verify.verify(parse(gold), parse(pred))` in one process, on the same pairs, in one run.

Mix: math-verify's own test cases (../shared/data/math_verify_cases.jsonl), MATH-500 answers paired
with the identical answer, an equivalent-but-different form and a wrong one, a repeat of every pair
(RL groups sample the same answer many times), and pathological inputs. Also reports agreement with
the suite's expectations, verdict differences between the two, and the worst batch of 512 pairs.

    python benchmarks/reward_bench.py [--data ../shared/data] [--timeout 5]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from pathlib import Path

from retool_cli.env.reward import Verifier

PATHOLOGICAL = [
    ("10^{10^{10}}", "10^{10^{10}} + 1"),
    ("2^{2^{2^{2^{2}}}}", "2^{65536}"),
    ("\\frac{1}{" * 200 + "2" + "}" * 200, "1"),
    ("(" * 300 + "x" + ")" * 300, "x"),
]


def equivalent_form(answer: str) -> str | None:
    """A different but equal way to write an answer, where there is an obvious one."""
    if re.fullmatch(r"-?\d+", answer):
        return f"{answer}.0" if len(answer) < 6 else None
    match = re.fullmatch(r"\\[dt]?frac\{(-?\d+)\}\{(\d+)\}", answer)
    if match:
        return f"{match.group(1)}/{match.group(2)}"
    if answer.startswith("\\frac"):
        return answer.replace("\\frac", "\\dfrac", 1)
    return f"\\left({answer}\\right)" if "," not in answer else None


def wrong_form(answer: str, rng: random.Random) -> str:
    if re.fullmatch(r"-?\d+", answer):
        return str(int(answer) + rng.choice([-2, -1, 1, 3]))
    return answer + "+1"


def build_pairs(data: Path, seed: int) -> tuple[list[tuple[str, str]], list[dict]]:
    rng = random.Random(seed)
    suite = [json.loads(line) for line in (data / "math_verify_cases.jsonl").read_text().splitlines()]
    pairs = [(row["gold"], row["pred"]) for row in suite]
    for line in (data / "math500.jsonl").read_text().splitlines():
        answer = json.loads(line)["answer"]
        pairs.append((answer, answer))
        pairs.append((answer, wrong_form(answer, rng)))
        if (other := equivalent_form(answer)) is not None:
            pairs.append((answer, other))
    pairs = pairs + pairs  # repeats, as within an RL group
    rng.shuffle(pairs)
    return pairs + PATHOLOGICAL, suite


def plain_verify(gold: str, pred: str) -> bool:
    from math_verify import parse, verify

    try:
        return bool(verify(parse(gold), parse(pred)))
    except Exception:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    pairs, suite = build_pairs(args.data, seed=0)
    normal = pairs[: -len(PATHOLOGICAL)]
    print(f"{len(normal)} pairs (+{len(PATHOLOGICAL)} pathological, measured separately)")

    plain_verify("1", "1")  # imports and sympy warm-up outside the timing
    started = time.perf_counter()
    plain = [plain_verify(g, p) for g, p in normal]
    plain_s = time.perf_counter() - started

    with Verifier(timeout_s=args.timeout, workers=args.workers) as verifier:
        verifier.verify_many([("\\frac{1}{2}", "0.5")] * args.workers)  # workers started and warm
        verifier._cache.clear()
        started = time.perf_counter()
        ours = verifier.verify_many(normal)
        ours_s = time.perf_counter() - started
        counts = dict(verifier.counts)

        print(f"plain math-verify: {len(normal) / plain_s:8.0f} pairs/s ({plain_s:.1f} s)")
        print(
            f"ours:              {len(normal) / ours_s:8.0f} pairs/s ({ours_s:.1f} s)   ratio {plain_s / ours_s:.1f}x"
        )
        print(f"paths: {counts}")
        differ = [(pair, p, o.equivalent) for pair, p, o in zip(normal, plain, ours, strict=True) if p != o.equivalent]
        print(f"verdicts differing from plain math-verify: {len(differ)}")
        for (gold, pred), p, o in differ[:10]:
            print(f"   gold={gold[:50]!r} pred={pred[:50]!r} plain={p} ours={o}")

        suite_ours = verifier.verify_many([(row["gold"], row["pred"]) for row in suite])
        agree = sum(v.equivalent == row["expected"] for v, row in zip(suite_ours, suite, strict=True))
        agree_plain = sum(plain_verify(row["gold"], row["pred"]) == row["expected"] for row in suite)
        print(f"agreement with the suite's expectations: ours {agree}/{len(suite)}, plain {agree_plain}/{len(suite)}")

        batch = normal[:508] + PATHOLOGICAL
        verifier._cache.clear()
        started = time.perf_counter()
        verdicts = verifier.verify_many(batch)
        worst = time.perf_counter() - started
        timeouts = sum(v.timed_out for v in verdicts)
        print(
            f"batch of {len(batch)} with {len(PATHOLOGICAL)} pathological pairs: {worst:.1f} s, "
            f"{timeouts} timed out (bound per pair {args.timeout} s, {args.workers} workers)"
        )


if __name__ == "__main__":
    main()
