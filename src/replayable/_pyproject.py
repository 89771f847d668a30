"""``[tool.replayable]`` in the nearest pyproject.toml: the settings file of a project."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

__all__ = ["project_config"]


def project_config(start: Path | None = None) -> dict[str, Any]:
    """``[tool.replayable]`` of the nearest pyproject.toml at or above ``start`` (the cwd)."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            try:
                data = tomllib.loads(candidate.read_text())
            except (OSError, tomllib.TOMLDecodeError):
                return {}
            section = data.get("tool", {}).get("replayable", {})
            return section if isinstance(section, dict) else {}
    return {}
