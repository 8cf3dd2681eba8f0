"""elastic-sharding: run a Data-Juicer recipe over fixed JSONL shards claimed through a shared directory."""

__version__ = "0.1.0"
