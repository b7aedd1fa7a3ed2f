"""Deterministic fault injection, for the resume tests: RETOOL_DIE_AFTER=step:N makes `retool train` or
`retool sft` die right after step N (its metrics and any checkpoint written), chunk:N makes a sampling run
(eval, filter-pass-rate) die right after its N-th chunk reached samples.jsonl, file:N makes `retool prepare`
die after writing its N-th output into its staging folder and placed:N after moving its N-th into place. It
dies as a node failure would: SIGKILL to itself, no cleanup, no exit handlers. Unset (always, outside tests)
it does nothing."""

from __future__ import annotations

import os
import signal

ENV = "RETOOL_DIE_AFTER"


def die_if_due(kind: str, count: int) -> None:
    """SIGKILL this process when RETOOL_DIE_AFTER is `kind:count`."""
    if os.environ.get(ENV) == f"{kind}:{count}":
        os.kill(os.getpid(), signal.SIGKILL)
