"""metrics.py against hand-computed values."""

from __future__ import annotations

import math

import pytest

from retool_cli.eval.metrics import avg_at_k, k_values, majority_answer, paired_difference, pass_at_k, sign_flip_p_value


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (10, 0, 1, 0.0),  # never right
        (10, 10, 5, 1.0),  # always right
        (5, 2, 5, 1.0),  # k = n: right if any sample is
        (5, 0, 5, 0.0),
        (4, 1, 1, 0.25),  # pass@1 = c/n
        (4, 2, 2, 1 - 1 / 6),  # 1 - C(2,2)/C(4,2)
        (10, 3, 4, 1 - math.comb(7, 4) / math.comb(10, 4)),
        (64, 1, 8, 8 / 64),  # one right sample: P(it is among 8 of 64)
    ],
)
def test_pass_at_k(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_is_stable_for_large_n_and_rejects_bad_input() -> None:
    assert pass_at_k(1000, 1, 1) == pytest.approx(0.001)
    assert 0 < pass_at_k(10_000, 5, 100) < 1
    for args in [(4, 5, 1), (4, 1, 0), (4, 1, 5), (4, -1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(*args)


def test_k_values() -> None:
    assert k_values(64) == [1, 2, 4, 8, 16, 32, 64]
    assert k_values(6) == [1, 2, 4, 6]
    assert k_values(1) == [1]


def test_avg_at_k_standard_errors_on_a_known_matrix() -> None:
    correct = [[True, True, False, False], [True, True, True, True], [False, False, False, False]]
    acc = avg_at_k(correct, bootstrap=500, seed=0)
    assert acc.mean == pytest.approx(0.5)
    # sampling: sum_i p_i(1-p_i)/(n-1) = 0.25/3 (only the first problem varies); sqrt(.)/3
    assert acc.se_sampling == pytest.approx(math.sqrt(0.25 / 3) / 3)
    # over problems: rates 0.5, 1, 0 -> sample variance 0.25 -> sqrt(0.25 / 3)
    assert acc.se_problems == pytest.approx(math.sqrt(0.25 / 3))
    assert 0.0 <= acc.ci95[0] <= 0.5 <= acc.ci95[1] <= 1.0
    assert avg_at_k(correct, bootstrap=500, seed=0) == acc  # seeded


def test_majority_clusters_by_equivalence_and_breaks_ties_by_first_seen() -> None:
    same = lambda a, b: a.replace("0.5", "1/2") == b.replace("0.5", "1/2")
    assert majority_answer(["3", "1/2", "0.5", "3", "1/2"], same) == "1/2"  # {1/2, 0.5, 1/2} beats {3, 3}
    assert majority_answer(["7", "5", "5", "7"], same) == "7"  # tie: the first seen wins
    assert majority_answer([None, None, "4"], same) == "4"  # missing answers do not vote
    assert majority_answer([None], same) is None


def test_resolve_checkpoint_and_step(tmp_path) -> None:
    from retool_cli.checkpoint_paths import latest_checkpoint, resolve_checkpoint
    from retool_cli.errors import ConfigError
    from retool_cli.eval.sampling import training_step

    for step in (5, 100, 20, 200):
        folder = tmp_path / "run" / "checkpoints" / f"step_{step}"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        if step != 200:  # step_200 lacks its trainer state: not a complete checkpoint (resume skips it too)
            (folder / "trainer_state.pt").write_bytes(b"")
    run = str(tmp_path / "run")
    assert resolve_checkpoint(run, "ckpt").name == "step_100"  # the latest complete, not the last listed
    assert latest_checkpoint(tmp_path / "run") == resolve_checkpoint(run, "ckpt")  # one definition
    assert resolve_checkpoint(f"{run}/checkpoints/step_5", "ckpt").name == "step_5"
    assert training_step(str(tmp_path / "run" / "checkpoints" / "step_20")) == 20 and training_step("gpt2") is None
    with pytest.raises(ConfigError, match=r"^trainer.init_from=.*neither a model folder"):
        resolve_checkpoint(str(tmp_path), "trainer.init_from")
    with pytest.raises(ConfigError, match=r"^ckpt=.*no such folder"):
        resolve_checkpoint(str(tmp_path / "nowhere"), "ckpt")


def test_paired_difference_by_hand() -> None:
    a = {"p1": 0.0, "p2": 0.5, "p3": 1.0, "only_a": 1.0}
    b = {"p1": 1.0, "p2": 0.5, "p3": 1.0, "only_b": 0.0}
    d = paired_difference(a, b)
    assert d.problems == 3 and d.mean == pytest.approx(1 / 3)  # differences 1, 0, 0 over the common problems
    assert d.se == pytest.approx(math.sqrt(1 / 3) / math.sqrt(3))  # sample std of (1, 0, 0) / sqrt(3)
    assert d.ci95[0] <= d.mean <= d.ci95[1] and d.p_value == 1.0  # one non-zero difference: either sign as large
    assert paired_difference(a, b) == d  # seeded: the same numbers every time
    with pytest.raises(ValueError, match="share no problem"):
        paired_difference({"x": 1.0}, {"y": 1.0})


def test_sign_flip_p_value_exact_and_drawn() -> None:
    assert sign_flip_p_value([0.5, 0.5, 0.5, 0.5]) == 2 / 16  # only all-plus and all-minus reach |2|
    assert sign_flip_p_value([0.0, 0.0]) == 1.0 and sign_flip_p_value([1.0, -1.0]) == 1.0
    assert sign_flip_p_value([0.25] * 100) == pytest.approx(1 / 10001)  # drawn: no draw reaches it but the data
    balanced = [0.5, -0.5] * 50
    assert sign_flip_p_value(balanced) > 0.9


def test_pairing_removes_the_problems_spread() -> None:
    """Problems of very different difficulty, B one point better on each: the unpaired errors are large, the
    paired one is zero and the difference is certain."""
    a = {f"p{i}": i / 40 for i in range(40)}
    b = {p: v + 0.01 for p, v in a.items()}
    d = paired_difference(a, b)
    unpaired = math.hypot(avg_at_k([[True] * i + [False] * (40 - i) for i in range(40)]).se_problems, 0)
    assert d.mean == pytest.approx(0.01) and d.se == pytest.approx(0.0, abs=1e-12) and unpaired > 0.04
    assert d.ci95 == pytest.approx((0.01, 0.01)) and d.p_value < 1e-3
