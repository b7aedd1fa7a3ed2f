"""rollout/engine_process.py's weight buckets: what the trainer broadcasts to an engine process, tensor by
tensor, in the sampling dtype. (The processes themselves run end to end in tests/cli/test_overlap.py.)"""

from __future__ import annotations

import torch

from retool_cli.rollout.engine_process import bucket_layout


def test_buckets_keep_the_order_cap_the_size_and_hold_one_dtype() -> None:
    state = {
        "a": torch.zeros(100),  # 200 bytes in bfloat16
        "b": torch.zeros(10, 10),
        "steps": torch.zeros(3, dtype=torch.long),  # an integer buffer travels as it is
        "c": torch.zeros(300),  # larger than a bucket: one of its own
        "d": torch.zeros(50),
    }
    layout = bucket_layout(state, torch.bfloat16, bucket_bytes=400)
    assert layout == [
        (torch.bfloat16, [("a", (100,)), ("b", (10, 10))]),
        (torch.long, [("steps", (3,))]),
        (torch.bfloat16, [("c", (300,))]),
        (torch.bfloat16, [("d", (50,))]),
    ]
    assert [name for _, entries in layout for name, _ in entries] == list(state)
