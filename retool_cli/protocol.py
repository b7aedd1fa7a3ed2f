"""The import path `retool_cli.protocol` other parts rely on (../shared/DESIGN.md); the code is in
retool_cli/env/protocol.py."""

from retool_cli.env.protocol import neutralize  # noqa: F401
