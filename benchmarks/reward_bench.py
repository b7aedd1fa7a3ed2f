"""Judge throughput: ours (cache + exact fast path + killable math-verify workers) against plain
`math_verify.verify(parse(gold), parse(pred))` in one process, on the same pairs, in one run.

Mix: math-verify's own test cases (../shared/data/math_verify_cases.jsonl), MATH-500 answers paired
with the identical answer, an equivalent-but-different form and a wrong one, a repeat of every pair
(RL groups sample the same answer many times), and pathological inputs. Also reports agreement with
the suite's expectations, verdict differences between the two, and the worst batch of 512 pairs.

Each repeat times both in a fresh process (plain first, then ours), so that neither meets the pairs already
parsed: sympy's cache and the LaTeX grammar's prediction caches made a second pass of plain math-verify over
the same pairs 3-10x faster in one process, and our workers' caches did the same for ours.

    python benchmarks/reward_bench.py [--data ../shared/data] [--timeout 5] [--repeats 3] [--pairs N]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import time
from pathlib import Path

from retool_cli.env.reward import Verifier

sys.path.insert(0, str(Path(__file__).parent))
from results import add_json_out, paired_ratios, spread, write

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


def one_repeat(data: Path, n: int, timeout: float, workers: int) -> dict:
    """Plain math-verify, then ours, over the first n pairs of the mix, in this (fresh) process: imports, the
    grammar and the workers are started by a warm-up on pairs outside the mix; what each learns of the mix's
    pairs (sympy's cache, the parsers' caches and DFAs, our result cache) starts empty, as in a run."""
    normal = build_pairs(data, seed=0)[0][: -len(PATHOLOGICAL)][:n]
    warm_up = [("\\frac{3}{7}", "3/7"), ("x^2+7", "7+x^2"), ("\\sqrt{7}", "7^{1/2}"), ("(7, 8)", "(8, 7)")]
    for gold, pred in warm_up:
        plain_verify(gold, pred)
    started = time.perf_counter()
    plain = [plain_verify(g, p) for g, p in normal]
    plain_per_s = len(normal) / (time.perf_counter() - started)
    with Verifier(timeout_s=timeout, workers=workers) as verifier:
        verifier.verify_many(warm_up * workers)  # workers started and warm
        verifier._cache.clear()
        verifier.counts.clear()
        started = time.perf_counter()
        ours = [v.equivalent for v in verifier.verify_many(normal)]
        ours_per_s = len(normal) / (time.perf_counter() - started)
        counts = dict(verifier.counts)
    return {"plain_per_s": plain_per_s, "ours_per_s": ours_per_s, "plain": plain, "ours": ours, "counts": counts}


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
    parser.add_argument("--repeats", type=int, default=3, help="each repeat times both, plain first")
    parser.add_argument("--pairs", type=int, default=None, help="only the first N pairs of the mix (a quick run)")
    add_json_out(parser)
    args = parser.parse_args()
    pairs, suite = build_pairs(args.data, seed=0)
    normal = pairs[: -len(PATHOLOGICAL)][: args.pairs]
    print(f"{len(normal)} pairs (+{len(PATHOLOGICAL)} pathological, measured separately), {args.repeats} repeats")

    rates: dict[str, list[float]] = {"plain": [], "ours": []}
    for _ in range(args.repeats):  # each in a fresh process: cold caches and grammar, the same work each time
        child = [sys.executable, __file__, "--_repeat", str(args.data), str(len(normal)), str(args.timeout)]
        proc = subprocess.run([*child, str(args.workers)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"a repeat failed:\n{proc.stderr[-3000:]}")
        one = json.loads(proc.stdout.splitlines()[-1])
        rates["plain"].append(one["plain_per_s"])
        rates["ours"].append(one["ours_per_s"])
        plain, ours, counts = one["plain"], one["ours"], one["counts"]
        print(f"plain math-verify {rates['plain'][-1]:6.0f} pairs/s, ours {rates['ours'][-1]:6.0f} pairs/s")
    with Verifier(timeout_s=args.timeout, workers=args.workers) as verifier:
        ratio = paired_ratios(rates["ours"], rates["plain"])
        print(f"ratio ours / plain {ratio['median']:.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f}); paths: {counts}")
        differ = [(pair, p, o) for pair, p, o in zip(normal, plain, ours, strict=True) if p != o]
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
    quantities = {
        "pairs": len(normal),
        "plain_pairs_per_s": spread(rates["plain"]),
        "ours_pairs_per_s": spread(rates["ours"]),
        "suite_agreement_ours": agree,
        "suite_agreement_plain": agree_plain,
        "pathological_batch_s": worst,
        "pathological_timeouts": timeouts,
    }
    checks = {"paths": counts, "verdicts_differing": len(differ), "suite_pairs": len(suite)}
    write(args.json_out, "reward", quantities, {"pairs_per_s_ours_over_plain": ratio}, checks)


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--_repeat":
        data, n, timeout, workers = Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
        print(json.dumps(one_repeat(data, n, timeout, workers)))
    else:
        main()
