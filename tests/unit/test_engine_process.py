"""rollout/engine_process.py's weight buckets: what the trainer broadcasts to an engine process, tensor by
tensor, in the sampling dtype; and a process closed while a request waits on it. (The processes run end to end in
tests/cli/test_overlap.py.)"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from retool_cli.interfaces import Sampling
from retool_cli.model.tiny import tiny_model_path
from retool_cli.rollout.engine_process import EngineProcess, EngineProcessDied, EngineSpec, bucket_layout


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


def test_a_request_in_flight_when_the_process_is_closed_fails_and_starts_nothing(tokenizer) -> None:
    """The run ends (or fails: a stuck engine's timeout) while a sampler's thread waits on the engine process:
    close() kills the process, and the waiting request fails rather than start a new one, which nothing would
    end and the interpreter's exit would wait for: a hang at the end of a run."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    spec = EngineSpec(model.config, model.generation_config, tokenizer, torch.float32, True, 1, slots=[0])
    engine = EngineProcess(spec, 0, timeout_s=60.0, restarts=3, bucket_bytes=2**20)
    engine.wait_started()
    engine.load(0, model)
    first = engine.process.pid
    os.kill(first, signal.SIGSTOP)  # stuck: the request below waits on it
    failed: list[BaseException] = []

    def sample() -> None:
        try:
            engine.generate(0, [[1, 2, 3]], [8], [], Sampling(seed=0), [0])
        except BaseException as error:
            failed.append(error)

    thread = threading.Thread(target=sample)
    thread.start()
    try:
        time.sleep(0.5)  # the request is sent and waits for an answer
        engine.close()
        thread.join(timeout=30)
        assert not thread.is_alive()
        assert [type(e) for e in failed] == [EngineProcessDied], failed
        assert "closed as the run ends" in str(failed[0])
        assert engine.process.pid == first and not multiprocessing.active_children()  # nothing started again
        with pytest.raises(EngineProcessDied, match="closed as the run ends"):
            engine.generate(0, [[1, 2, 3]], [8], [], Sampling(seed=0), [0])  # nor later
        assert not multiprocessing.active_children()
    finally:  # a failing check leaves no stopped or restarted process for this test run's exit to wait on
        for child in multiprocessing.active_children():
            child.kill()
