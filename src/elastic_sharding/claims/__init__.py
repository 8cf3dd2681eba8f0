"""The coordination protocol through the shared directory: claims (`protocol`), heartbeats and
fencing (`heartbeat`), the takeover decision (`takeover`), what a shard is (`shard_state`), its
attempt history (`history`), and a `dlc` submission's phases (`submission`)."""
