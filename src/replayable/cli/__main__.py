"""``python -m replayable.cli``: the same as the ``replayable`` command."""

from replayable.cli import main

main()
