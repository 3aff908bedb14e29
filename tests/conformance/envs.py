"""Where the recording environments built by ``setup_envs.sh`` live, and which one runs a
scenario.

``DIR`` is ``$ASSAYWATCH_CONFORMANCE_ENVS``, else ``~/.cache/assaywatch/conformance-envs``;
in it, ``env-a`` and ``env-b`` hold the exact versions that recorded the fixtures
(``requirements.txt``, ``requirements-openai-v2.txt``), ``env-latest`` and
``env-latest-v2`` the newest releases within the same major versions
(``requirements-latest*.txt``), used by the CI re-record subset.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ENV_VAR", "OPENAI_V2", "envs_dir", "env_name", "interpreter", "setup_hint"]

ENV_VAR = "ASSAYWATCH_CONFORMANCE_ENVS"
DEFAULT_DIR = Path("~/.cache/assaywatch/conformance-envs")
#: Scenarios recorded in the openai-v2 environment (it cannot share one with the genai-*
#: packages, see requirements-openai-v2.txt).
OPENAI_V2 = frozenset({"otel_openai_v2_with_agent", "otel_openai_v2_bare"})


def envs_dir() -> Path:
    """The folder holding the environments (it may not exist)."""
    return Path(os.environ.get(ENV_VAR) or DEFAULT_DIR).expanduser()


def env_name(scenario: str, latest: bool = False) -> str:
    """The environment that runs ``scenario``: pinned (default) or newest releases."""
    if scenario in OPENAI_V2:
        return "env-latest-v2" if latest else "env-b"
    return "env-latest" if latest else "env-a"


def interpreter(scenario: str, latest: bool = False, root: Path | None = None) -> Path | None:
    """The Python of ``scenario``'s environment, or None when it was not built (or is
    half-built: ``setup_envs.sh`` writes its stamp last)."""
    env = (root or envs_dir()) / env_name(scenario, latest)
    python = env / "bin" / "python"
    stamp = env / ".assaywatch-requirements.sha256"
    return python if python.exists() and stamp.exists() else None


def setup_hint(root: Path | None = None) -> str:
    where = root or envs_dir()
    return (f"the conformance recording environments are not in {where}: create them with "
            f"`bash tests/conformance/setup_envs.sh` (about 4 minutes cold; "
            f"{ENV_VAR}=DIR chooses the folder)")
