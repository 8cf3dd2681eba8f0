"""Whole-dataset operators other than the deduplicators, run as stages across all shards.

Data-Juicer runs its selectors, groupers, aggregators and `document_line_deduplicator` in its
default executor only, on one machine. Each becomes a stage between two recipe segments, made
of the same create-once units as a deduplication stage (`claims/units.py`): `keys` (what every
shard contributes), `buckets` (partitions of those keys merged), `place` (for operators whose
output leaves the shard it came from: every row's destination and rank) and `keep` (per shard
of the next segment: its rows, written by the one shared step in `work/stages.py`).
`operators.py` says which operators are stages and which are refused; one module per family.
"""
