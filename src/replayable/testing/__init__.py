"""Incidents as tests: fixture files, sanitizing, and the pytest plugin.

- :mod:`~replayable.testing.fixture`: ``export_fixture`` writes a run tree to one
  self-contained file, ``load_fixture`` reads it into a memory store to replay,
  ``import_fixture`` loads it into a store.
- :mod:`~replayable.testing.sanitize`: personal data replaced by pseudonyms
  before a production run becomes a test asset, with a manifest of what was
  replaced where.
- :mod:`~replayable.testing.plugin`: the pytest plugin (``pytest11`` entry
  point): the ``replayable`` marker and the ``replayable_run`` fixture.

Importing this package does not import pytest.
"""

from replayable.testing.fixture import (
    FIXTURE_VERSION,
    Fixture,
    collect_fixture,
    export_fixture,
    import_fixture,
    load_fixture,
    read_fixture,
    sanitize_fixture,
    write_fixture,
)
from replayable.testing.sanitize import Manifest, Sanitizer, SanitizeRules

__all__ = [
    "FIXTURE_VERSION",
    "Fixture",
    "Manifest",
    "SanitizeRules",
    "Sanitizer",
    "collect_fixture",
    "export_fixture",
    "import_fixture",
    "load_fixture",
    "read_fixture",
    "sanitize_fixture",
    "write_fixture",
]
