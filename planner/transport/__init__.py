"""FPM transport at fleet scale: NATS subjects and credentials (:mod:`.subjects`, :mod:`.nats_config`) and the
NATS ingest source that feeds a FleetStore (:mod:`.nats_source`). Direct ZMQ (:mod:`planner.ingest.subscriber`)
stays the embedded default."""
