"""rollout/weight_slots.py: one engine sampling for several weight versions in turn, each call with its own
slot's weights, whatever order the calls come in (a real hf engine on a tiny Qwen2)."""

from __future__ import annotations

import copy
import threading
from types import SimpleNamespace

import torch

from retool_cli.interfaces import Sampling
from retool_cli.rollout.hf_engine import HFEngine
from retool_cli.rollout.weight_slots import SlotEngine, WeightSlots
from tests.unit.test_hf_engine import EOS, PAD, tiny_model

PROMPTS = [[5, 17, 3, 44, 9], [8, 2]]
SAMPLING = Sampling(temperature=1.0, seed=3)


def engine(model: torch.nn.Module) -> HFEngine:
    tokenizer = SimpleNamespace(eos_token_id=EOS, pad_token_id=PAD, decode=lambda ids: "", encode=lambda t, **k: [])
    return HFEngine(model, tokenizer, own_copy=True)


def tokens(sampler: HFEngine | SlotEngine) -> list[list[int]]:
    return [g.token_ids for g in sampler.generate(PROMPTS, [12, 12], [], SAMPLING, seeds=[1, 2])]


def test_each_slot_samples_with_its_own_weights_in_any_order() -> None:
    versions = [tiny_model("qwen2")]
    for _ in range(2):
        newer = copy.deepcopy(versions[-1])
        with torch.no_grad():
            for p in newer.parameters():
                p.add_(torch.randn_like(p) * 0.5)
        versions.append(newer)
    expected = [tokens(engine(v)) for v in versions]  # each version on an engine of its own
    assert expected[0] != expected[1] != expected[2]  # the versions sample differently

    counter = {"loads": 0}
    shared = engine(copy.deepcopy(versions[0]))
    load = shared.update_weights

    def counted(policy: object) -> None:
        counter["loads"] += 1
        load(policy)

    shared.update_weights = counted  # type: ignore[method-assign]
    slots = WeightSlots(shared)
    views = [SlotEngine(slots, i) for i in range(3)]
    for view, version in zip(views, versions, strict=True):
        view.update_weights(version)
    assert counter["loads"] == 0  # loaded when a call needs them, not before
    assert [tokens(views[i]) for i in (2, 0, 1, 1, 2)] == [expected[i] for i in (2, 0, 1, 1, 2)]
    assert counter["loads"] == 4  # the repeated call to slot 1 found its weights in place

    views[1].update_weights(versions[0])  # slot 1's next version, while slot 2's weights are in the engine
    assert tokens(views[1]) == expected[0]

    # calls from threads at once take turns, each with its slot's weights
    results: dict[int, list[list[int]]] = {}
    threads = [threading.Thread(target=lambda i=i: results.update({i: tokens(views[i])})) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {0: expected[0], 1: expected[0], 2: expected[2]}
