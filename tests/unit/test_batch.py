"""batch.py: every operation keeps tensors and objects aligned."""

from __future__ import annotations

import pytest
import torch

from retool_cli.rl.batch import Batch


def make(n: int = 4, width: int = 3) -> Batch:
    return Batch(
        {"ids": torch.arange(n * width).view(n, width), "reward": torch.arange(n).float()},
        {"name": [f"s{i}" for i in range(n)]},
        {"step": 7},
    )


def test_length_and_consistency_check() -> None:
    assert len(make()) == 4 and len(Batch()) == 0
    with pytest.raises(ValueError, match="disagree on the number of samples"):
        Batch({"a": torch.zeros(3)}, {"b": [1, 2]})


def test_union() -> None:
    full = make()
    a, b = Batch({"ids": full.tensors["ids"]}, dict(full.objects)), Batch({"reward": full.tensors["reward"]})
    both = a.union(b)
    assert set(both.tensors) == {"ids", "reward"} and both.objects["name"] == ["s0", "s1", "s2", "s3"]
    clash = make()
    clash.tensors["reward"] = clash.tensors["reward"] + 1
    with pytest.raises(ValueError, match="tensor 'reward' differs"):
        make().union(clash)
    with pytest.raises(ValueError, match="union of batches of 4 and 2"):
        make().union(make(2))


def test_concat_pads_and_merges_metrics() -> None:
    a, b = make(2, width=3), make(1, width=5)
    a.meta["metrics"], b.meta["metrics"] = {"loss": 1.0}, {"loss": [2.0, 3.0], "kl": 0.1}
    both = Batch.concat([a, b])
    assert both.tensors["ids"].shape == (3, 5)
    assert both.tensors["ids"][0].tolist() == [0, 1, 2, 0, 0]  # right-padded
    assert both.objects["name"] == ["s0", "s1", "s0"]
    assert both.meta["metrics"] == {"loss": [1.0, 2.0, 3.0], "kl": [0.1]}
    with pytest.raises(ValueError, match="same fields"):
        Batch.concat([make(), Batch({"ids": make().tensors["ids"]}, dict(make().objects))])


def test_index_keeps_tensors_and_objects_aligned() -> None:
    picked = make().index([3, 1, 1])
    assert picked.tensors["reward"].tolist() == [3.0, 1.0, 1.0] and picked.objects["name"] == ["s3", "s1", "s1"]
    assert picked.tensors["ids"][0].tolist() == [9, 10, 11] and picked.meta == {"step": 7}
