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


def test_select_and_pop() -> None:
    batch = make()
    only = batch.select(tensors=["reward"], objects=[])
    assert list(only.tensors) == ["reward"] and not only.objects and only.meta == {"step": 7}
    popped = batch.pop(tensors=["ids"])
    assert "ids" not in batch.tensors and torch.equal(popped.tensors["ids"], make().tensors["ids"])


def test_union() -> None:
    a, b = make().select(tensors=["ids"]), make().select(tensors=["reward"], objects=[])
    both = a.union(b)
    assert set(both.tensors) == {"ids", "reward"} and both.objects["name"] == ["s0", "s1", "s2", "s3"]
    clash = make()
    clash.tensors["reward"] = clash.tensors["reward"] + 1
    with pytest.raises(ValueError, match="tensor 'reward' differs"):
        make().union(clash)
    with pytest.raises(ValueError, match="union of batches of 4 and 2"):
        make().union(make(2))


def test_repeat_is_interleaved() -> None:
    batch = make(2).repeat(3)
    assert batch.objects["name"] == ["s0", "s0", "s0", "s1", "s1", "s1"]
    assert batch.tensors["reward"].tolist() == [0, 0, 0, 1, 1, 1]


def test_split_chunk_reorder() -> None:
    parts = make(5).split(2)
    assert [len(p) for p in parts] == [2, 2, 1] and parts[2].objects["name"] == ["s4"]
    assert [p.objects["name"] for p in make(4).chunk(2)] == [["s0", "s1"], ["s2", "s3"]]
    with pytest.raises(ValueError, match="equal parts"):
        make(5).chunk(2)
    flipped = make().reorder([3, 2, 1, 0])
    assert flipped.objects["name"] == ["s3", "s2", "s1", "s0"] and flipped.tensors["reward"].tolist() == [
        3,
        2,
        1,
        0,
    ]
    with pytest.raises(ValueError, match="permutation"):
        make().reorder([0, 0, 1, 2])


def test_concat_pads_and_merges_metrics() -> None:
    a, b = make(2, width=3), make(1, width=5)
    a.meta["metrics"], b.meta["metrics"] = {"loss": 1.0}, {"loss": [2.0, 3.0], "kl": 0.1}
    both = Batch.concat([a, b])
    assert both.tensors["ids"].shape == (3, 5)
    assert both.tensors["ids"][0].tolist() == [0, 1, 2, 0, 0]  # right-padded
    assert both.objects["name"] == ["s0", "s1", "s0"]
    assert both.meta["metrics"] == {"loss": [1.0, 2.0, 3.0], "kl": [0.1]}
    with pytest.raises(ValueError, match="same fields"):
        Batch.concat([make(), make().select(tensors=["ids"])])
