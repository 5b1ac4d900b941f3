"""nats-server configuration for the FPM event plane: one user per worker that may publish only on its own
subjects (:func:`planner.transport.subjects.worker_wildcard`) and subscribe to nothing, and consumer users (the
planner, its ingest shards) that may subscribe to the namespace's FPM subjects and publish nowhere else than
the subjects given to them.

The server enforces the permissions, and that is what makes the worker id in a subject trustworthy: a worker
that publishes under another worker's subject gets a permissions violation and the message never reaches a
subscriber. Rendered as JSON, which nats-server's configuration format accepts. Passwords are plain text here
(tests, development); a production server would hold bcrypt hashes or use NKEYs/JWTs, with the same
permissions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from planner.transport.subjects import namespace_wildcard, worker_wildcard

__all__ = ["render_server_config"]


def render_server_config(
    *,
    port: int,
    namespace: str,
    workers: Mapping[str, str],
    consumers: Mapping[str, str],
    consumer_publish: Sequence[str] = (),
    host: str = "127.0.0.1",
    max_payload_bytes: int = 64 * 1024,
    mappings: Mapping[str, str] | None = None,
) -> str:
    """The server configuration text.

    ``workers``: worker id -> password (the user name is the worker id). ``consumers``: user -> password, each
    may subscribe to every FPM subject of ``namespace`` (and to ``consumer_publish`` subjects, which it may also
    publish on, e.g. shard summaries). ``max_payload_bytes`` caps a message as ``ZMQ_MAXMSGSIZE`` does on the
    direct path. ``mappings``: subject mappings (e.g. partitions for ingest shards)."""
    if not namespace:
        raise ValueError("namespace must not be empty")
    if set(workers) & set(consumers):
        raise ValueError(f"user names used for both a worker and a consumer: {sorted(set(workers) & set(consumers))}")
    users: list[dict[str, object]] = [
        {
            "user": worker_id,
            "password": password,
            "permissions": {
                "publish": {"allow": [worker_wildcard(namespace, worker_id)]},
                "subscribe": {"deny": [">"]},
            },
        }
        for worker_id, password in workers.items()
    ]
    extra = list(consumer_publish)
    users += [
        {
            "user": user,
            "password": password,
            "permissions": {
                "publish": {"allow": extra} if extra else {"deny": [">"]},
                "subscribe": {"allow": [namespace_wildcard(namespace), *extra, "_INBOX.>"]},
            },
        }
        for user, password in consumers.items()
    ]
    config: dict[str, object] = {
        "host": host,
        "port": port,
        "max_payload": max_payload_bytes,
        "authorization": {"users": users},
    }
    if mappings:
        config["mappings"] = dict(mappings)
    return json.dumps(config, indent=2)
