"""Sharded ingest: N shard processes each own a partition of the workers (:mod:`.partition`), run their own
FleetStore fed from NATS, and publish a per-tick :class:`~planner.shard.summary.ShardSummary`; the leader merges
the summaries into the snapshot its decision core reads (:mod:`.merge`), never the raw samples."""
