"""Deduplication across all shards with exactly the keep rule of one Data-Juicer run.

Every supported deduplicator keeps the first row (in input order) of each group of rows it
considers duplicates, so one model covers them all: rows are nodes, the operator's own hash
decides which rows are connected, and a row is kept when no row before it is in its connected
component. The work is units that write files, so any worker can take any of them:

  keys        per shard: the operator's `compute_hash` on each row, written as bucket records
              (`keys.py`), each carrying the row's global position;
  buckets     per partition of the bucket space: the rows that share a bucket, turned into the
              rows to drop (exact duplicates) or into edges (near duplicates) (`buckets.py`);
  components  per partition of the positions, in rounds: minimum-label propagation over the
              edges until no label changes (`components.py`);
  keep        per shard: the positions to drop, read from the partitions that hold them.

`rules.py` says which operators are supported and how each one's hash becomes bucket keys;
`arrays.py` is the on-disk format of the partitioned record files; `stage.py` is each unit's work
and `cooperate.py` shares a stage's units among any number of processes.
"""
