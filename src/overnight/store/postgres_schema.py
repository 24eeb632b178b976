"""PostgreSQL schema versions: the migrations list and the migrator (spec: ``docs/FORMAT.md``).

Like LangGraph's ``PostgresSaver.MIGRATIONS``, the schema is an append-only list: migration *n*
brings a store from version *n - 1* to *n*, and the versions applied are rows of a ledger table,
``overnight_schema``. Unlike it, :func:`migrate`

* runs every pending migration **in one transaction holding** ``pg_advisory_xact_lock`` (a lock
  per schema), so processes opening a new store at once do not race: the first one migrates, the
  others wait and then find nothing left to do; a migration that fails rolls back entirely
  (PostgreSQL DDL is transactional) and leaves the store at its previous version;
* **refuses a store whose version is newer** than the newest migration this code knows
  (:class:`~overnight.errors.StoreVersionError`) instead of running against a schema it does not
  understand;
* checks the list itself: versions are 1, 2, 3, ... and no statement uses ``CONCURRENTLY``
  (``CREATE INDEX CONCURRENTLY`` cannot run inside a transaction; a new index on a large existing
  table is created by the operator, out of band, before an upgrade that relies on it).

Never edit a released migration: append a new one.

Text the caller controls (task ids, goals, branch and step names, sessions, events, timestamps,
holder JSON) is stored as ``bytea`` holding UTF-8 (lone surrogates passed through), because
PostgreSQL ``text`` can hold neither U+0000 nor a lone surrogate. ``bytea`` compares byte-wise,
which is the order SQLite's ``BINARY`` collation gives, so listings sort the same on both.
Digests and checkpoint ids (``sha256:`` + hex, which the store checks) stay ``text COLLATE "C"``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from overnight.errors import ConfigError, StoreSchemaMismatch, StoreVersionError


@dataclass(frozen=True)
class Migration:
    """One schema version.

    Attributes:
        version: the version the schema has after this migration (1, 2, ...).
        description: one line, stored in the ledger.
        statements: SQL statements; ``{s}`` stands for the quoted schema name.
        creates: what the statements create, as ``table``, ``index`` or ``table.column`` -- how
            :func:`check_shape` tells a schema at this version from one half-migrated to it
            (``name()`` for a function).
    """

    version: int
    description: str
    statements: tuple[str, ...]
    creates: tuple[str, ...] = ()


# A commit as one statement (one round trip, its own transaction under autocommit), doing what
# PostgresStore.commit did in eight: the lease row FOR SHARE and its fencing token, the ref moved by
# compare-and-set, the parent FOR KEY SHARE, the task row, the objects (insert if absent, else
# refresh the stored time: the row lock keeps gc off it; re-insert one deleted meanwhile), the
# checkpoint and its journal rows. Every refusal raises (rolling everything back) with its own
# SQLSTATE, read by PostgresStore.commit: OV001 lease lost (DETAIL 'h' + hex of the holder JSON,
# or ''), OV002 stale head (DETAIL '=' + the current head, or ''), OV003 parent not stored or of
# another task (DETAIL 'p' + hex of its task id, or ''), OV004 a stored object has other bytes
# under the same digest (DETAIL: those digests; the caller judges them and calls again with each
# in p_replace -- damaged, rewritten -- or p_keep -- intact, the first write wins).
# p_retry: the caller lost the answer to an identical call (the connection died); a head that
# already is p_id means that call committed, and its stored_bytes is returned.
_COMMIT_FUNCTION = """CREATE FUNCTION {s}.commit_checkpoint(
    p_l_task bytea, p_l_branch bytea, p_l_holder bytea, p_l_token bigint,
    p_expected text, p_now bigint, p_retry boolean,
    p_id text, p_task bytea, p_parent text, p_branch bytea, p_seq bigint, p_created bytea, p_session bytea,
    p_event bytea, p_step bytea, p_body bytea, p_signature text,
    p_t_task bytea, p_t_created bytea, p_t_goal bytea, p_t_entry bytea, p_t_spec bytea,
    p_o_digest text[], p_o_kind text[], p_o_size bigint[], p_o_codec text[], p_o_data bytea[],
    p_replace text[], p_keep text[],
    p_j_task bytea[], p_j_cp text[], p_j_seq bigint[], p_j_key text[], p_j_name bytea[], p_j_session bytea[],
    p_j_started bytea[], p_j_duration double precision[], p_j_in bigint[], p_j_out bigint[]
) RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
    v_lease record;
    v_current text;
    v_parent bytea;
    v_n bigint;
    v_added bigint := 0;
    v_todo text[] := p_o_digest;
    v_inserted text[];
    v_present text[];
    v_refreshed text[];
    v_rest text[] := '{}';
    v_bad text[];
BEGIN
    IF p_l_task IS NOT NULL THEN
        SELECT holder_id, holder, token INTO v_lease FROM {s}.leases
         WHERE task_id = p_l_task AND branch = p_l_branch FOR SHARE;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'OV001', MESSAGE = 'lease lost', DETAIL = '';
        ELSIF v_lease.holder_id <> p_l_holder OR v_lease.token <> p_l_token THEN
            RAISE EXCEPTION USING ERRCODE = 'OV001', MESSAGE = 'lease lost',
                DETAIL = CASE WHEN v_lease.holder_id <> ''::bytea THEN 'h' || encode(v_lease.holder, 'hex') ELSE '' END;
        END IF;
    END IF;
    IF p_expected IS NOT NULL THEN
        UPDATE {s}.refs SET checkpoint_id = p_id, updated_at_ms = p_now
         WHERE task_id = p_task AND branch = p_branch AND checkpoint_id = p_expected;
    ELSE
        INSERT INTO {s}.refs VALUES (p_task, p_branch, p_id, p_now) ON CONFLICT DO NOTHING;
    END IF;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n <> 1 THEN
        SELECT checkpoint_id INTO v_current FROM {s}.refs WHERE task_id = p_task AND branch = p_branch;
        IF p_retry AND v_current = p_id THEN
            RETURN (SELECT stored_bytes FROM {s}.checkpoints WHERE checkpoint_id = p_id);
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'OV002', MESSAGE = 'stale head', DETAIL = coalesce('=' || v_current, '');
    END IF;
    IF p_parent IS NOT NULL THEN
        SELECT task_id INTO v_parent FROM {s}.checkpoints WHERE checkpoint_id = p_parent FOR KEY SHARE;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'OV003', MESSAGE = 'parent not stored', DETAIL = '';
        ELSIF v_parent <> p_task THEN
            RAISE EXCEPTION USING ERRCODE = 'OV003', MESSAGE = 'parent of another task',
                DETAIL = 'p' || encode(v_parent, 'hex');
        END IF;
    END IF;
    IF p_t_task IS NOT NULL THEN
        INSERT INTO {s}.tasks VALUES (p_t_task, p_t_created, p_t_goal, p_t_entry, p_t_spec) ON CONFLICT DO NOTHING;
    END IF;
    -- p_o_digest is sorted and without duplicates (the order delete_objects locks in)
    FOR i IN 1..5 LOOP
        EXIT WHEN cardinality(v_todo) = 0;
        WITH ins AS (
            INSERT INTO {s}.objects (digest, kind, size, codec, data)
            SELECT u.d, u.k, u.n, u.c, u.x FROM unnest(p_o_digest, p_o_kind, p_o_size, p_o_codec, p_o_data)
                AS u(d, k, n, c, x) WHERE u.d = ANY(v_todo)
            ON CONFLICT (digest) DO NOTHING RETURNING digest, octet_length(data) AS n)
        SELECT coalesce(array_agg(digest), '{}'), coalesce(sum(n), 0) INTO v_inserted, v_n FROM ins;
        v_added := v_added + v_n;
        v_present := ARRAY(SELECT d FROM unnest(v_todo) AS d WHERE d <> ALL(v_inserted));
        EXIT WHEN cardinality(v_present) = 0;
        WITH up AS (
            UPDATE {s}.objects SET stored_at_ms = (extract(epoch from clock_timestamp()) * 1000)::bigint
             WHERE digest = ANY(v_present) RETURNING digest)
        SELECT coalesce(array_agg(digest), '{}') INTO v_refreshed FROM up;
        v_rest := v_rest || v_refreshed;
        v_todo := ARRAY(SELECT d FROM unnest(v_present) AS d WHERE d <> ALL(v_refreshed));
    END LOOP;
    IF cardinality(v_rest) > 0 THEN
        v_bad := ARRAY(
            SELECT o.digest FROM {s}.objects o
              JOIN unnest(p_o_digest, p_o_kind, p_o_size, p_o_codec, p_o_data) AS u(d, k, n, c, x) ON o.digest = u.d
             WHERE o.digest = ANY(v_rest) AND NOT (o.digest = ANY(p_replace)) AND NOT (o.digest = ANY(p_keep))
               AND (o.kind, o.size, o.codec, o.data) IS DISTINCT FROM (u.k, u.n, u.c, u.x));
        IF cardinality(v_bad) > 0 THEN
            RAISE EXCEPTION USING ERRCODE = 'OV004', MESSAGE = 'stored objects differ',
                DETAIL = array_to_string(v_bad, ' ');
        END IF;
        WITH rep AS (
            UPDATE {s}.objects o SET kind = u.k, size = u.n, codec = u.c, data = u.x
              FROM unnest(p_o_digest, p_o_kind, p_o_size, p_o_codec, p_o_data) AS u(d, k, n, c, x)
             WHERE o.digest = u.d AND o.digest = ANY(v_rest) AND o.digest = ANY(p_replace)
               AND (o.kind, o.size, o.codec, o.data) IS DISTINCT FROM (u.k, u.n, u.c, u.x)
            RETURNING octet_length(u.x) AS n)
        SELECT v_added + coalesce(sum(n), 0) INTO v_added FROM rep;
    END IF;
    INSERT INTO {s}.checkpoints VALUES (p_id, p_task, p_parent, p_branch, p_seq, p_created, p_session, p_event,
        p_step, p_body, p_signature, octet_length(p_body) + v_added) ON CONFLICT DO NOTHING;
    INSERT INTO {s}.journal
        SELECT * FROM unnest(p_j_task, p_j_cp, p_j_seq, p_j_key, p_j_name, p_j_session, p_j_started, p_j_duration,
                             p_j_in, p_j_out)
        ON CONFLICT DO NOTHING;
    RETURN octet_length(p_body) + v_added;
END
$fn$"""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "objects, tasks, checkpoints, refs, journal, leases", (
        """CREATE TABLE {s}.objects (
            digest text COLLATE "C" PRIMARY KEY,
            kind   text COLLATE "C" NOT NULL,
            size   bigint NOT NULL,
            codec  text COLLATE "C" NOT NULL,
            data   bytea NOT NULL
        )""",
        # payloads are zstd frames or incompressible: do not let TOAST try pglz on them again
        "ALTER TABLE {s}.objects ALTER COLUMN data SET STORAGE EXTERNAL",
        """CREATE TABLE {s}.tasks (
            task_id    bytea PRIMARY KEY,
            created_at bytea NOT NULL,
            goal       bytea NOT NULL,
            entry      bytea,
            spec       bytea NOT NULL
        )""",
        """CREATE TABLE {s}.checkpoints (
            checkpoint_id text COLLATE "C" PRIMARY KEY,
            task_id       bytea NOT NULL,
            parent_id     text COLLATE "C",
            branch        bytea NOT NULL,
            seq           bigint NOT NULL,
            created_at    bytea NOT NULL,
            session       bytea NOT NULL,
            event         bytea NOT NULL,
            step          bytea,
            body          bytea NOT NULL,
            signature     text COLLATE "C",
            stored_bytes  bigint NOT NULL
        )""",
        "CREATE INDEX checkpoints_task ON {s}.checkpoints (task_id, seq)",
        """CREATE TABLE {s}.refs (
            task_id       bytea NOT NULL,
            branch        bytea NOT NULL,
            checkpoint_id text COLLATE "C" NOT NULL,
            updated_at_ms bigint NOT NULL,
            PRIMARY KEY (task_id, branch)
        )""",
        """CREATE TABLE {s}.journal (
            task_id       bytea NOT NULL,
            checkpoint_id text COLLATE "C" NOT NULL,
            seq           bigint NOT NULL,
            step_key      text COLLATE "C" NOT NULL,
            step_name     bytea NOT NULL,
            session       bytea NOT NULL,
            started_at    bytea NOT NULL,
            duration_ms   double precision NOT NULL,
            tokens_in     bigint NOT NULL,
            tokens_out    bigint NOT NULL,
            PRIMARY KEY (checkpoint_id, step_key)
        )""",
        "CREATE INDEX journal_task ON {s}.journal (task_id, seq)",
        """CREATE TABLE {s}.leases (
            task_id       bytea NOT NULL,
            branch        bytea NOT NULL,
            holder_id     bytea NOT NULL,
            holder        bytea NOT NULL,
            token         bigint NOT NULL,
            expires_at_ms bigint NOT NULL,
            PRIMARY KEY (task_id, branch)
        )""",
    ), creates=("objects", "tasks", "checkpoints", "checkpoints_task", "refs", "journal", "journal_task", "leases")),
    Migration(2, "call journal", (
        """CREATE TABLE {s}.calls (
            task_id        bytea NOT NULL,
            step_key       text COLLATE "C" NOT NULL,
            seq            bigint NOT NULL,
            request_digest text COLLATE "C" NOT NULL,
            model          bytea NOT NULL,
            response       bytea NOT NULL,
            tokens_in      bigint NOT NULL,
            tokens_out     bigint NOT NULL,
            latency_ms     double precision NOT NULL,
            created_at     bytea NOT NULL,
            PRIMARY KEY (task_id, step_key, seq, request_digest)
        )""",
    ), creates=("calls",)),
    Migration(3, "object stored times (for gc), archive catalog, parent index", (
        # now() is stable: evaluated once, so existing rows read the migration time without a rewrite
        "ALTER TABLE {s}.objects ADD COLUMN stored_at_ms bigint NOT NULL "
        "DEFAULT (extract(epoch from now()) * 1000)::bigint",
        "ALTER TABLE {s}.objects ALTER COLUMN stored_at_ms SET DEFAULT "
        "(extract(epoch from clock_timestamp()) * 1000)::bigint",
        """CREATE TABLE {s}.archives (
            task_id    bytea NOT NULL,
            archive_id text COLLATE "C" NOT NULL,
            created_at bytea NOT NULL,
            location   bytea NOT NULL,
            manifest   bytea NOT NULL,
            PRIMARY KEY (task_id, archive_id)
        )""",
        "CREATE INDEX checkpoints_parent ON {s}.checkpoints (parent_id)",
    ), creates=("objects.stored_at_ms", "archives", "checkpoints_parent")),
    Migration(4, "commit_checkpoint(): a commit in one statement", (_COMMIT_FUNCTION,),
              creates=("commit_checkpoint()",)),
)

_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def quote_schema(schema: str) -> str:
    """``"schema"``; raises :class:`~overnight.errors.ConfigError` (a ``ValueError``) unless it is
    a plain identifier of at most 63 characters."""
    if not _SCHEMA_NAME.match(schema):
        raise ConfigError(f"schema name {schema!r} must be letters, digits and _ (at most 63, not starting with a digit)")
    return f'"{schema}"'


def check_migrations(migrations: tuple[Migration, ...]) -> int:
    """Validate the list (versions 1..n in order, no ``CONCURRENTLY``); returns n.

    Raises:
        ConfigError: the list is malformed.
    """
    for i, m in enumerate(migrations, start=1):
        if m.version != i:
            raise ConfigError(f"migration #{i} has version {m.version}; versions must be 1, 2, 3, ...")
        for statement in m.statements:
            if re.search(r"\bCONCURRENTLY\b", statement, re.IGNORECASE):
                raise ConfigError(f"migration {m.version} uses CONCURRENTLY, which cannot run inside the "
                                 "migration transaction")
    return len(migrations)


def lock_key(schema: str) -> int:
    """The ``pg_advisory_xact_lock`` key of a schema's migrations (a signed 64-bit int)."""
    return int.from_bytes(hashlib.sha256(f"overnight.migrate:{schema}".encode()).digest()[:8], "big", signed=True)


def _too_new(where: str, found: int, known: int) -> StoreVersionError:
    return StoreVersionError(
        f"store {where} has schema version {found}, written by a newer overnight (this one knows up to {known})",
        hint="upgrade overnight (pip install -U overnight) to open this store",
    )


def current_version(conn, schema: str) -> int:
    """The schema's version (0 when it has no ledger yet). ``conn`` is in autocommit mode."""
    ledger = f"{quote_schema(schema)}.overnight_schema"
    row = conn.execute("SELECT to_regclass(%s)", (ledger,)).fetchone()
    if row is None or row[0] is None:
        return 0
    return conn.execute(f"SELECT coalesce(max(version), 0) FROM {ledger}").fetchone()[0]


def _present(conn, schema: str) -> set[str]:
    """Every table, index, ``table.column`` and ``function()`` in ``schema`` (one catalog query:
    it runs on every open)."""
    rows = conn.execute(
        "SELECT c.relname, NULL FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'i') "
        "UNION ALL SELECT c.relname, a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped "
        "UNION ALL SELECT p.proname || '()', NULL FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = %s", (schema, schema, schema)).fetchall()
    return {name if column is None else f"{name}.{column}" for name, column in rows}


def check_shape(conn, schema: str, version: int, *, where: str,
                migrations: tuple[Migration, ...] = MIGRATIONS) -> None:
    """Check that the tables of ``schema`` are those of ``version``: everything migrations
    1..version create is there, nothing a later one creates is.

    Raises:
        StoreSchemaMismatch: they disagree (a half-migrated or hand-edited schema), naming what is
            missing and what is early, and the SQL that resolves it.
    """
    present = _present(conn, schema)
    q = quote_schema(schema)
    missing = [f"{o} (version {m.version})" for m in migrations[:version] for o in m.creates if o not in present]
    early = [(m, o) for m in migrations[version:] for o in m.creates if o in present]
    if not missing and not early:
        return
    parts, hints = [], []
    if missing:
        parts.append("lacks " + ", ".join(missing))
        hints.append("restore the schema from a backup (or, if it holds nothing yet, "
                     f"DROP SCHEMA {q} CASCADE and open it again)")
    if early:
        parts.append("already has " + ", ".join(f"{o} (created by version {m.version})" for m, o in early))
        first = early[0][0]
        complete = all(o in present for o in first.creates)
        hints.append(f"if every object of version {first.version} ({', '.join(first.creates)}) is there, record it: "
                     f"INSERT INTO {q}.overnight_schema (version, description) VALUES ({first.version}, "
                     f"'{first.description}'); otherwise drop what it half-created so it can run again"
                     if complete else
                     f"version {first.version} was applied in part: drop what it created "
                     f"({', '.join(o for _, o in early)}) so the migration can run again, or restore a backup")
    raise StoreSchemaMismatch(
        f"store {where}: schema {schema!r} records version {version} but its tables disagree -- it "
        + "; ".join(parts) + " (half-migrated or edited by hand); overnight writes nothing to it",
        missing=[o for m in migrations[:version] for o in m.creates if o not in present],
        unexpected=[o for _, o in early], hint="; ".join(hints))


def migrate(conn, schema: str, *, where: str, migrations: tuple[Migration, ...] = MIGRATIONS,
            check: bool = True) -> int:
    """Bring ``schema`` to the newest version in ``migrations``; returns that version.

    ``conn`` is a psycopg connection in autocommit mode. Safe to call from many processes at once
    and to call again: an up-to-date schema costs two queries and takes no lock.

    Before migrating, and on every open of an up-to-date schema, :func:`check_shape` compares the
    recorded version with the tables, so a half-migrated schema is refused with what disagrees
    instead of PostgreSQL's "column already exists" halfway through a migration. ``check=False``
    skips it for an up-to-date schema only (a caller that checked the same schema before).

    Raises:
        StoreVersionError: the schema is newer than ``migrations`` (``where`` names the store).
        StoreSchemaMismatch: the recorded version disagrees with the tables.
        psycopg.Error: a migration failed (everything it did is rolled back).
    """
    latest = check_migrations(migrations)
    found = current_version(conn, schema)
    if found > latest:
        raise _too_new(where, found, latest)
    if found == latest:
        if check:
            check_shape(conn, schema, found, where=where, migrations=migrations)
        return latest
    q = quote_schema(schema)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(schema),))
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {q}")
        conn.execute(f"""CREATE TABLE IF NOT EXISTS {q}.overnight_schema (
            version     integer PRIMARY KEY,
            description text NOT NULL,
            applied_at  timestamptz NOT NULL DEFAULT now()
        )""")
        found = conn.execute(f"SELECT coalesce(max(version), 0) FROM {q}.overnight_schema").fetchone()[0]
        if found > latest:
            raise _too_new(where, found, latest)
        if found == latest:  # another process migrated it while this one waited for the lock
            check_shape(conn, schema, found, where=where, migrations=migrations)
            return latest
        check_shape(conn, schema, found, where=where, migrations=migrations)
        for m in migrations[found:]:
            for statement in m.statements:
                conn.execute(statement.replace("{s}", q))
            conn.execute(f"INSERT INTO {q}.overnight_schema (version, description) VALUES (%s, %s)",
                         (m.version, m.description))
    return latest
