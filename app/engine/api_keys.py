"""Per-tenant API keys over the database: create (shown once), list, revoke, verify.

Used by ``treadle api-keys`` (straight on the database, like ``treadle migrate``), by the
``/admin/api-keys`` endpoints and, as the :class:`~app.auth.authenticator.ApiKeyVerifier`,
by the API's authenticator. Key format and hashing: :mod:`app.auth.api_keys`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from app.auth import api_keys as keys
from app.auth.principal import Principal, Scope
from app.core.errors import ApiKeyNotFound, InvalidInput, Unauthenticated
from app.core.ids import is_tenant_id, new_uuid7
from app.db.database import Database
from app.db.queries import api_keys as q

# ``last_used_at`` is written at most this often per key (per process, and by the
# database clock): an API key used on every request must not cost a write per request.
LAST_USED_RESOLUTION_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class CreatedKey:
    """A new key's row and its one-time secret ``token``."""

    row: RowMapping
    token: str


def parse_scopes(values: Iterable[str]) -> list[Scope]:
    """Validate scope names (order kept, duplicates dropped).

    Raises:
        InvalidInput: an unknown scope or none at all (422).
    """
    names = list(dict.fromkeys(values))
    unknown = [n for n in names if n not in Scope._value2member_map_]
    if unknown or not names:
        raise InvalidInput(
            f"unknown scope(s) {unknown}; known: {[s.value for s in Scope]}"
            if unknown
            else "an API key needs at least one scope",
            errors=[{"path": "scopes", "message": "invalid"}],
        )
    return [Scope(n) for n in names]


def subject_of(row: RowMapping) -> str:
    """The subject an API key acts as (recorded as ``created_by``, ``actor``)."""
    return f"api-key:{row['prefix']}"


class ApiKeyService:
    """Create, list, revoke and verify API keys.

    Args:
        db: the database.
        on_revoke: called with a key's id once its revocation committed: the API process
            drops the key from its verified-token cache
            (:meth:`app.auth.token_cache.TokenCache.forget_api_key`).
    """

    def __init__(
        self, db: Database, *, on_revoke: Callable[[uuid.UUID], None] | None = None
    ) -> None:
        self.db = db
        self._on_revoke = on_revoke
        self._touched: dict[uuid.UUID, float] = {}

    async def create(
        self, *, tenant_id: str, name: str, scopes: Iterable[str], created_by: str
    ) -> CreatedKey:
        """Generate and store a key; the returned ``token`` is never retrievable again.

        Raises:
            InvalidInput: a malformed tenant or name, or bad scopes (422).
        """
        if not is_tenant_id(tenant_id):
            raise InvalidInput(
                "tenant must be 1..128 characters of letters, digits, _ . -",
                errors=[{"path": "tenant", "message": "invalid"}],
            )
        if not name.strip() or len(name) > 200 or not name.isprintable():
            raise InvalidInput(
                "name must be 1..200 printable characters",
                errors=[{"path": "name", "message": "invalid"}],
            )
        scope_list = parse_scopes(scopes)
        new = keys.generate()

        async def insert(conn: AsyncConnection) -> RowMapping:
            return await q.insert_key(
                conn,
                key_id=new_uuid7(),
                tenant_id=tenant_id,
                name=name,
                prefix=new.prefix,
                secret_hash=new.secret_hash,
                scopes=" ".join(s.value for s in scope_list),
                created_by=created_by,
            )

        row = await self.db.write_retrying(insert, what="create API key")
        return CreatedKey(row=row, token=new.token)

    async def list_keys(
        self, tenant_id: str, *, include_revoked: bool = True
    ) -> Sequence[RowMapping]:
        """The tenant's keys, oldest first (hashes included; never show them)."""
        async with self.db.read() as conn:
            return await q.list_keys(conn, tenant_id, include_revoked=include_revoked)

    async def revoke(self, *, tenant_id: str, key_id: uuid.UUID, actor: str) -> RowMapping:
        """Revoke a key: later requests with it are 401 and its runs fail.

        At once on this process (``on_revoke``); other API processes stop accepting it
        within their ``TREADLE_AUTH_CACHE_TTL_SECONDS`` (docs/security.md#token-cache).

        Idempotent: revoking a revoked key returns it unchanged.

        Raises:
            ApiKeyNotFound: not this tenant's key (404).
        """

        async def revoke(conn: AsyncConnection) -> RowMapping | None:
            await q.revoke(conn, tenant_id, key_id, actor)
            return await q.get_key(conn, tenant_id, key_id)

        row = await self.db.write_retrying(revoke, what="revoke API key")
        if self._on_revoke is not None:
            self._on_revoke(key_id)
        if row is None:
            raise ApiKeyNotFound(f"API key {key_id} not found", key_id=str(key_id))
        return row

    async def verify(self, token: str) -> Principal:
        """Check a presented key: well-formed, known, hash equal, not revoked.

        One indexed read; the API's authenticator caches the result for at most
        ``TREADLE_AUTH_CACHE_TTL_SECONDS`` (:mod:`app.auth.token_cache`). Writes
        nothing: :meth:`mark_used` records the use once the request is let in.

        Raises:
            Unauthenticated: anything wrong; the detail says which part for the log
                (the authenticator answers every bad credential with one 401 detail).
        """
        prefix = keys.parse_prefix(token)
        if prefix is None:
            raise Unauthenticated("invalid token: malformed API key")
        async with self.db.read() as conn:
            row = await q.by_prefix(conn, prefix)
        if row is None or not keys.matches(token, row["secret_hash"]):
            raise Unauthenticated("invalid token: unknown API key")
        if row["revoked_at"] is not None:
            raise Unauthenticated("invalid token: the API key is revoked")
        return Principal(
            tenant_id=row["tenant_id"],
            subject=subject_of(row),
            scopes=frozenset(Scope(s) for s in row["scopes"].split()),
            api_key_id=row["key_id"],
        )

    async def mark_used(self, principal: Principal) -> None:
        """Refresh the key's ``last_used_at``, at most once a minute per key and process."""
        if principal.api_key_id is not None:
            await self._touch(principal.api_key_id)

    async def _touch(self, key_id: uuid.UUID) -> None:
        now = time.monotonic()
        if now - self._touched.get(key_id, -1e18) < LAST_USED_RESOLUTION_SECONDS:
            return
        self._touched[key_id] = now
        async with self.db.write() as conn:
            await q.touch(conn, key_id, min_interval=LAST_USED_RESOLUTION_SECONDS)
