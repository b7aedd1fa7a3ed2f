"""Judge accuracy by answer category: correct verdicts of ours (the Verifier: fast path + judge workers), plain
`math_verify.verify(parse(gold), parse(pred))`, and math-verify reading both answers as math (`$gold$`, `$pred$`),
on the labelled pairs of tests/data/judge_cases.jsonl; then agreement with math-verify's own suite.

    python benchmarks/judge_accuracy.py [--cases tests/data/judge_cases.jsonl] [--wrong]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import defaultdict
from pathlib import Path

from retool_cli.env.judge import plain_math_verify
from retool_cli.env.reward import Verifier

sys.path.insert(0, str(Path(__file__).parent))
from results import add_json_out, write

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, default=ROOT / "tests" / "data" / "judge_cases.jsonl")
    parser.add_argument("--suite", type=Path, default=ROOT / "tests" / "data" / "math_verify_cases.jsonl")
    parser.add_argument("--wrong", action="store_true", help="list the pairs each judge gets wrong")
    parser.add_argument("--limit", type=int, default=None, help="only the first N pairs of each file (a quick run)")
    add_json_out(parser)
    args = parser.parse_args()
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    rows = [json.loads(line) for line in args.cases.read_text(encoding="utf-8").splitlines()][: args.limit]
    with Verifier(timeout_s=20.0, workers=2) as verifier:
        ours = [v.equivalent for v in verifier.verify_many([(r["gold"], r["pred"]) for r in rows])]
        suite = [json.loads(line) for line in args.suite.read_text(encoding="utf-8").splitlines()][: args.limit]
        suite_ours = verifier.verify_many([(r["gold"], r["pred"]) for r in suite])
    judges = {
        "ours": ours,
        "plain math-verify": [plain_math_verify(r["gold"], r["pred"], False) for r in rows],
        "math-verify `$...$`": [plain_math_verify(r["gold"], r["pred"], True) for r in rows],
    }
    table: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for i, row in enumerate(rows):
        table[row["category"]]["pairs"] += 1
        for name, verdicts in judges.items():
            table[row["category"]][name] += verdicts[i] is row["equal"]
            if args.wrong and verdicts[i] is not row["equal"]:
                print(f"  {name:20} wrong on {row['id']}: {row['gold']!r} vs {row['pred']!r} (label {row['equal']})")
    print("| category | pairs | " + " | ".join(judges) + " |")
    print("|---|---:|" + "---:|" * len(judges))
    for category, counts in [
        *table.items(),
        ("**all**", {k: sum(c[k] for c in table.values()) for k in ("pairs", *judges)}),
    ]:
        print(f"| {category} | {counts['pairs']} | " + " | ".join(str(counts[name]) for name in judges) + " |")
    agree = sum(v.equivalent is r["expected"] for v, r in zip(suite_ours, suite, strict=True))
    plain = sum(plain_math_verify(r["gold"], r["pred"], False) is r["expected"] for r in suite)
    print(f"\nmath-verify's suite: ours {agree}/{len(suite)}, plain math-verify {plain}/{len(suite)}")
    # correct verdicts are counts, the same on every run: no repeats, no spread
    quantities = {f"all/{name}": sum(c[name] for c in table.values()) for name in ("pairs", *judges)}
    quantities |= {"suite/ours": agree, "suite/plain math-verify": plain, "suite/pairs": len(suite)}
    write(args.json_out, "judge_accuracy", quantities, checks={"categories": len(table)})


if __name__ == "__main__":
    main()
