"""FPM ingestion: the ZMQ subscriber (I/O shell) and the FleetStore it feeds (pure)."""

from planner.ingest.store import (
    DropReason,
    EndpointSeen,
    FleetSnapshot,
    FleetStore,
    RankView,
)

__all__ = ["DropReason", "EndpointSeen", "FleetSnapshot", "FleetStore", "RankView"]
