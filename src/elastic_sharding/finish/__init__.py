"""Stage 3, finish: prove every shard output (`validate`), publish them in order (`merge`, with
`parallel_copy`), check a published output (`verify`), requeue failed shards (`retry`)."""
