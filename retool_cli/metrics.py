"""The import path `retool_cli.metrics` other parts rely on (../shared/DESIGN.md); the code is in
retool_cli/eval/metrics.py."""

from retool_cli.eval.metrics import pass_at_k  # noqa: F401
