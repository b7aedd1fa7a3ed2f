"""Weight transfer to an engine process (rollout.placement=separate, rollout/engine_process.py): the trainer's
gloo broadcasts in buckets, against what a colocated engine does instead (load_state_dict into its own copy),
side by side on the same weights.

    python benchmarks/weight_transfer_bench.py [--mb 1024] [--rounds 3] [--buckets-mb 16 64 256]

The weights: fp32 matrices of a Qwen2-7B layer's shapes (hidden 3584, MLP 18944), whole layers until at least
--mb MiB (1,024 gives 1.74 GiB), sent in bf16 (the sampling dtype) as the trainer sends them, to a spawned
process that receives and unflattens each bucket.
Reported: seconds per GiB of fp32 weights until the receiver holds them, for each bucket size, and broadcast /
in-process copy per round (each transfer's checksum is compared after, outside the timing).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from results import add_json_out, paired_ratios, spread, write

HIDDEN, MLP = 3584, 18944
TIMEOUT_S = 600.0


def weights(mb: int) -> dict[str, torch.Tensor]:
    """fp32 matrices of a 7B layer's shapes, in layer order, until `mb` MiB."""
    shapes = [(HIDDEN, HIDDEN), (512, HIDDEN), (512, HIDDEN), (HIDDEN, HIDDEN), (MLP, HIDDEN), (MLP, HIDDEN)]
    shapes += [(HIDDEN, MLP)]
    state: dict[str, torch.Tensor] = {}
    total, layer = 0, 0
    generator = torch.Generator().manual_seed(0)
    while total < mb * 2**20:
        for i, shape in enumerate(shapes):
            state[f"layers.{layer}.{i}"] = torch.randn(shape, generator=generator)
            total += state[f"layers.{layer}.{i}"].numel() * 4
        layer += 1
    return state


def receiver(port: int, layouts: list, reply: multiprocessing.Queue) -> None:
    """The engine process's side: receive every layout's transfer, say when it has it, then its checksum."""
    import datetime

    import torch.distributed as dist

    from retool_cli.rollout.engine_process import gloo_group, receive_weights

    store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    group = gloo_group(store, 1, TIMEOUT_S)
    for layout in layouts:
        state = receive_weights(group, layout, TIMEOUT_S)
        reply.put("received")
        reply.put(float(sum(t.float().sum() for t in state.values())))


def main() -> None:
    args = arguments()
    import datetime

    import torch.distributed as dist

    from retool_cli.rollout.engine_process import bucket_layout, gloo_group, send_weights

    state = weights(args.mb)
    gib = sum(t.numel() * 4 for t in state.values()) / 2**30
    layouts = [bucket_layout(state, torch.bfloat16, mb * 2**20) for mb in args.buckets_mb] * args.rounds
    context = multiprocessing.get_context("spawn")
    store = dist.TCPStore(
        "127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=TIMEOUT_S), wait_for_workers=False
    )
    reply = context.Queue()
    child = context.Process(target=receiver, args=(store.port, layouts, reply))
    child.start()
    group = gloo_group(store, 0, TIMEOUT_S)
    sent: dict[int, list[float]] = {mb: [] for mb in args.buckets_mb}
    copies: list[float] = []
    engine_copy = {name: tensor.to(torch.bfloat16) for name, tensor in state.items()}
    expected = float(sum(t.to(torch.bfloat16).float().sum() for t in state.values()))
    for i, layout in enumerate(layouts):
        mb = args.buckets_mb[i % len(args.buckets_mb)]
        started = time.perf_counter()
        send_weights(group, state, layout, TIMEOUT_S, number=0)
        assert reply.get(timeout=TIMEOUT_S) == "received"  # unflattened on the other side, ready to load
        sent[mb].append(time.perf_counter() - started)
        received = reply.get(timeout=TIMEOUT_S)  # the checksum, outside the timing
        assert abs(received - expected) <= 1e-3 * max(1.0, abs(expected)), (received, expected)
        if mb == args.buckets_mb[0]:  # the colocated engine's load, once a round
            started = time.perf_counter()
            for name, tensor in state.items():
                engine_copy[name].copy_(tensor)  # load_state_dict's copy, cast to the engine's dtype
            copies.append(time.perf_counter() - started)
    child.join()
    quantities = {"weights_gib_fp32": gib, "copy_s_per_gib": spread([c / gib for c in copies])}
    ratios = {}
    for mb, seconds in sent.items():
        quantities[f"bucket_{mb}mb/broadcast_s_per_gib"] = spread([s / gib for s in seconds])
        ratios[f"bucket_{mb}mb/broadcast_over_copy"] = paired_ratios(seconds, copies)
        print(f"buckets of {mb} MiB: {statistics.median(seconds) / gib:.2f} s per GiB (fp32 weights, sent in bf16)")
    print(f"in-process copy: {statistics.median(copies) / gib:.2f} s per GiB")
    write(args.json_out, "weight_transfer", quantities, ratios, {"peer": "a colocated engine's in-memory copy"})


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=1024, help="MiB of fp32 weights")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--buckets-mb", type=int, nargs="+", default=[16, 64, 256])
    add_json_out(parser)
    return parser.parse_args()


if __name__ == "__main__":
    main()
