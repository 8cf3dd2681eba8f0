"""Stage 1, prepare: validate and fingerprint the input, plan scan units, scan them (cooperatively,
with every participant that joins), cut the shard boundaries, write the shards, and publish the
job directory whole (`job.prepare` is the entry)."""
