"""Each library warning once, through our log (cli.route_library_logs)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import io, logging
from retool_cli.cli import route_library_logs

ours = io.StringIO()
logging.basicConfig(stream=ours, level=logging.INFO, format="%(name)s: %(message)s")
route_library_logs()
import datasets  # noqa: F401  (adds its own stderr handler at import, as the hub does)
from huggingface_hub.utils import logging as hub_logging

http = hub_logging.get_logger("huggingface_hub.utils._http")
for attempt in range(1, 6):  # the hub's retries: one message, other numbers
    http.warning("Retrying in %ds [Retry %d/5].", 2**attempt, attempt)
logging.getLogger("datasets.load").warning("a dataset note")
logging.getLogger("retool").warning("ours, twice")
logging.getLogger("retool").warning("ours, twice")
print(ours.getvalue(), end="")
"""


def test_library_warnings_print_once_and_only_through_our_log() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True)
    assert proc.stdout.splitlines() == [
        "huggingface_hub.utils._http: Retrying in 2s [Retry 1/5].",
        "datasets.load: a dataset note",
        "retool: ours, twice",
        "retool: ours, twice",  # our own messages are never dropped
    ]
    assert "Retrying" not in proc.stderr and "dataset note" not in proc.stderr  # no handler of their own


def test_vllm_notes_are_filtered_and_the_rest_shown_once() -> None:
    import logging

    from retool_cli.rollout.vllm_engine import _VllmNotes

    notes = _VllmNotes()

    def shown(name: str, message: str) -> bool:
        return notes.filter(logging.LogRecord(name, logging.WARNING, "x.py", 1, message, None, None))

    assert not shown("vllm.worker.cpu_worker", "libtcmalloc is not found in LD_PRELOAD. For best performance ...")
    assert not shown("vllm.engine.arg_utils", "The global random seed is set to 0. Since ...")
    assert not shown("vllm.envs", "Unknown vLLM environment variable detected: VLLM_DIST_IDENT")
    assert shown("vllm.v1.core", "KV cache is too small for max_model_len")  # something to act on: shown
    assert not shown("vllm.v1.core", "KV cache is too small for max_model_len")  # once
    assert shown("retool", "libtcmalloc is not found in LD_PRELOAD")  # not vLLM's: untouched
