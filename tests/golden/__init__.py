"""Golden runs: recorded runs of every record schema and chain format, checked in.

``python -m tests.golden.record`` writes them again (only when a new schema or
chain format is added: the files of the old ones stay as they were written).
"""
