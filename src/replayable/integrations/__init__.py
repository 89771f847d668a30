"""Adapters that record and replay agents built on other libraries.

- :mod:`replayable.integrations.http` — the HTTP seam: ``httpx`` and
  ``httpx2`` transports, sync and async, streaming included. Every HTTP-based
  LLM SDK goes through it.
- :mod:`replayable.integrations.openai` and
  :mod:`replayable.integrations.anthropic` — SDK clients wired to the seam.
- :mod:`replayable.integrations.ag2` — AG2 agents: model calls, tool
  executions and human input through ag2's middleware, substituted on replay.

Importing this package imports no third-party library.
"""
