"""The import path `retool_cli.reward` other parts rely on (../shared/DESIGN.md); the code is in
retool_cli/env/reward.py."""

from retool_cli.env.reward import Verifier, extract_boxed, is_equivalent, score, score_batch  # noqa: F401
