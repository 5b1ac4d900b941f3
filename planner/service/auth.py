"""Credentials: named bearer tokens, each with a role, resolved per request into a :class:`Principal`.

Roles (:class:`TokenRole`), each allowing what the ones below it allow::

    operator   bounds and every other mutation, and worker registration
    worker     register / renew / deregister workers (PUT/DELETE /v1/workers/{id}) only
    read       nothing that mutates (reads are open; a read token only names its holder)

Where tokens come from (never from the configuration file):

* ``FPM_PLANNER_TOKEN`` — an ``operator`` token named ``default`` (backward compatible with the single token);
* ``FPM_PLANNER_WORKER_TOKEN`` — a ``worker`` token named ``worker``;
* ``FPM_PLANNER_READ_TOKEN`` — a ``read`` token named ``read``;
* ``auth.tokens_file`` / ``FPM_PLANNER_TOKENS_FILE`` — a YAML file (a mounted Secret) listing
  ``tokens: [{name, role, token}, ...]``.

Every token must be at least :data:`MIN_TOKEN_BYTES` bytes (UTF-8) and names must be unique; otherwise
:func:`load_credentials` raises :class:`~planner.errors.ConfigError` and the service does not start.
A request's token is compared with every known token in constant time. The token itself is never logged or
shown: handlers read :attr:`Principal.name`.
"""

from __future__ import annotations

import enum
import hmac
import re
from collections.abc import Mapping
from pathlib import Path

import msgspec
import yaml

from planner.errors import ConfigError

__all__ = ["MIN_TOKEN_BYTES", "Credentials", "Principal", "TokenRole", "load_credentials"]

MIN_TOKEN_BYTES = 32
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@:-]{0,62}$")


class TokenRole(enum.StrEnum):
    READ = "read"
    WORKER = "worker"
    OPERATOR = "operator"


_RANK = {TokenRole.READ: 0, TokenRole.WORKER: 1, TokenRole.OPERATOR: 2}


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    """Who made a request: the credential's name (safe to log and audit) and its role."""

    name: str
    role: TokenRole

    def allows(self, needed: TokenRole) -> bool:
        return _RANK[self.role] >= _RANK[needed]


class _Token(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    role: TokenRole
    token: str


class _TokensFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    tokens: tuple[_Token, ...] = ()


class Credentials:
    """The known tokens. :meth:`resolve` maps a presented token to its Principal (None: unknown)."""

    def __init__(self, tokens: Mapping[str, tuple[TokenRole, str]]) -> None:
        """``tokens``: name -> (role, token)."""
        self._tokens = [(name, role, token.encode()) for name, (role, token) in tokens.items()]

    @property
    def principals(self) -> tuple[Principal, ...]:
        return tuple(Principal(name=name, role=role) for name, role, _ in self._tokens)

    def has(self, role: TokenRole) -> bool:
        """Whether any token allows ``role``."""
        return any(Principal(name=n, role=r).allows(role) for n, r, _ in self._tokens)

    def resolve(self, presented: str) -> Principal | None:
        given = presented.encode()
        found: Principal | None = None
        for name, role, token in self._tokens:  # compare with all of them: no early exit on a match
            if hmac.compare_digest(given, token) and found is None:
                found = Principal(name=name, role=role)
        return found


def load_credentials(
    *,
    operator_token: str | None,
    worker_token: str | None,
    read_token: str | None,
    tokens_file: str | None,
) -> Credentials:
    """The credentials from the environment's tokens and the tokens file. Raises ConfigError naming the
    source (never the token) when a token is too short, a name repeats or the file does not validate."""
    entries: list[tuple[str, str, TokenRole, str]] = []  # (source, name, role, token)
    for var, name, role, token in (
        ("FPM_PLANNER_TOKEN", "default", TokenRole.OPERATOR, operator_token),
        ("FPM_PLANNER_WORKER_TOKEN", "worker", TokenRole.WORKER, worker_token),
        ("FPM_PLANNER_READ_TOKEN", "read", TokenRole.READ, read_token),
    ):
        if token:
            entries.append((var, name, role, token))
    if tokens_file is not None:
        try:
            raw = yaml.safe_load(Path(tokens_file).read_text())
            parsed = msgspec.convert(raw or {}, _TokensFile)
        except OSError as exc:
            raise ConfigError(f"auth.tokens_file {tokens_file}: cannot read: {exc.strerror or exc}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"auth.tokens_file {tokens_file}: not valid YAML{_where(exc)}") from None
        except msgspec.ValidationError as exc:  # msgspec names the field and the type, never a string's value
            raise ConfigError(f"auth.tokens_file {tokens_file}: {exc}") from exc
        for i, entry in enumerate(parsed.tokens):
            entries.append((f"auth.tokens_file {tokens_file}: tokens[{i}]", entry.name, entry.role, entry.token))
    tokens: dict[str, tuple[TokenRole, str]] = {}
    seen: set[str] = set()
    for source, name, role, token in entries:
        if not _NAME.match(name):
            raise ConfigError(f"{source}: name {name!r} must be 1-63 letters, digits or _.@:- (first alphanumeric)")
        if name in tokens:
            raise ConfigError(f"{source}: a credential named {name!r} is already defined")
        if len(token.encode()) < MIN_TOKEN_BYTES:
            raise ConfigError(
                f"{source}: the token of {name!r} is {len(token.encode())} bytes; at least {MIN_TOKEN_BYTES} "
                "are required (e.g. `openssl rand -hex 32`)"
            )
        if token in seen:
            raise ConfigError(f"{source}: the token of {name!r} is also used by another credential")
        seen.add(token)
        tokens[name] = (role, token)
    return Credentials(tokens)


def _where(exc: yaml.YAMLError) -> str:
    """Where a YAML error is, without the snippet PyYAML quotes (it could hold a token)."""
    mark = getattr(exc, "problem_mark", None)
    return "" if mark is None else f" (line {mark.line + 1}, column {mark.column + 1})"
