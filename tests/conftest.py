import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from filelock import FileLock

# Built models (model=tiny) go to a cache private to this test session, never the user's; removed at the end.
_OWN_CACHE = None
if "RETOOL_CACHE" not in os.environ:
    _OWN_CACHE = os.environ["RETOOL_CACHE"] = tempfile.mkdtemp(prefix="retool-test-cache-")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under pytest-xdist (`make test`: a worker per core) each worker's commands get one thread: two workers' torch
# thread pools on two cores would wait on each other at every parallel op. Results do not depend on it: the runs a
# test compares all run under the same setting.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")


def pytest_sessionfinish(session, exitstatus):
    if _OWN_CACHE is not None:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def sft_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run folder of one `retool sft` of the tiny model (tests.helpers.SFT), made once per test run: under
    pytest-xdist by the first worker that asks, the others waiting on the lock (the session's base folder, whose
    parent the workers share, is per worker)."""
    from tests.helpers import SFT, run_retool

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    run = shared / "sft_checkpoint" / "run"
    with FileLock(str(shared / "sft_checkpoint.lock")):
        if not (run / "final.txt").exists():
            run.parent.mkdir(exist_ok=True)
            run_retool("sft", *SFT, f"hydra.run.dir={run}", cwd=run.parent, check=True)
    return run


@pytest.fixture(scope="module", autouse=True)
def no_vllm_engine_left_open() -> Iterator[None]:
    """A test file that builds vLLM engines in the pytest process closes them (VLLMEngine.close). Left open, an
    engine is shut down by vLLM's finalizer whenever the collector gets to it, and that tears down vLLM's
    process-wide groups under whatever engine the worker has built since: CI saw another file's engine fail on
    `None.rank` while it compiled."""
    yield
    parallel_state = sys.modules.get("vllm.distributed.parallel_state")
    if parallel_state is not None and parallel_state.model_parallel_is_initialized():
        pytest.fail("a vLLM engine built in this file was left open: close it (VLLMEngine.close) when done")


# The test files that take longest (seconds on a 2-core machine with 2 workers, README "Development"), run first:
# pytest-xdist hands a worker a whole file at a time in this order, so the long ones do not end up last on one
# worker while the other waits.
LONGEST_FIRST = [
    "tests/cli/test_overlap.py",
    "tests/cli/test_overlap_processes.py",
    "tests/cli/test_nodes.py",
    "tests/unit/test_benchmarks.py",
    "tests/cli/test_train.py",
    "tests/cli/test_stops.py",
    "tests/cli/test_real_models.py",
    "tests/cli/test_vllm.py",
    "tests/unit/test_sandbox.py",
    "tests/cli/test_eval.py",
    "tests/unit/test_zygote.py",
    "tests/cli/test_prepare.py",
    "tests/unit/test_vllm_engine.py",
    "tests/unit/test_distributed.py",
    "tests/cli/test_mistakes.py",
    "tests/cli/test_report.py",
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    root = config.rootpath
    items.sort(key=lambda item: rank.get(item.path.relative_to(root).as_posix(), len(rank)))  # stable: file order kept
