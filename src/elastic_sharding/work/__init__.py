"""Stage 2, work: a worker's claim loop (`worker`), one attempt (`attempt`), claiming the next
shard early (`lookahead`), collecting an attempt's output (`collect`), and the runners that run
Data-Juicer on a node-local Ray (`runners/`)."""
