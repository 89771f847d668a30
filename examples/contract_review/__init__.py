"""A contract-review agent with a silent failure, and a demo that records and replays it."""
