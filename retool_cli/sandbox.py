"""The import path `retool_cli.sandbox` other parts rely on (../shared/DESIGN.md); the code is in
retool_cli/env/sandbox.py."""

from retool_cli.env.sandbox import ExecResult, Sandbox  # noqa: F401
