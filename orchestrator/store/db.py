"""The one owner of SQLite: opening state.db, migrations, and short write transactions.

A command that only reads (create=False) on a state.db it cannot write (an archived sweep on a
read-only filesystem, a read-only or immutable file) opens it read-only: `mode=ro`, or
`immutable=1` where SQLite cannot make the WAL's shared-memory file beside it. Reads then work;
a write is refused in one line that says it is a write.

Every failure of sqlite3 is turned into StoreError with a message a user can act on.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlite_utils

from orchestrator.clock import SYSTEM_CLOCK, Clock
from orchestrator.errors import DatabaseDiskFull, MissingDatabase, StoreError
from orchestrator.store.migrations import MIGRATIONS

BUSY_TIMEOUT_S = 30.0


def default_db_path() -> Path:
    return Path(os.environ.get("ORCH_DB") or "state.db")


class Store:
    """A connection to state.db. One per process (or thread); cheap to open."""

    def __init__(self, path: Path, *, create: bool = True, clock: Clock = SYSTEM_CLOCK) -> None:
        self.path = Path(path)
        self.clock = clock  # stamps rows (queued_at, started_at, ended_at) on the clock that judges them
        if not create and not self.path.exists():
            raise MissingDatabase(f"no state database at {self.path} (submit a sweep first, or pass --db)")
        # why this store is read-only (a reader's, on a database it cannot write); None: writable
        self.read_only: str | None = None if create else _not_writable(self.path)
        if self.read_only is not None:
            self._db = sqlite_utils.Database(_open_read_only(self.path))
            if MIGRATIONS.pending(self._db):
                self.close()
                raise StoreError(f"cannot read state database {self.path}: it is from an older orch and needs "
                                 f"migrating, which needs writing ({self.read_only}); open it once where it "
                                 "is writable, or copy it")
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            existed = self.path.exists()
            if existed:
                _refuse_emptied(self.path)
                if _not_writable(self.path) == READ_ONLY_FS:  # a writer: say so, not "cannot open"
                    raise StoreError(f"cannot write state database {self.path}: {READ_ONLY_FS}")
            # Owner-only from the first byte: state.db holds configs and paths.
            old_umask = os.umask(0o077)
            try:
                conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S, check_same_thread=False)
            finally:
                os.umask(old_umask)
            if not existed:
                os.chmod(self.path, 0o600)
            conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
            _enable_wal(conn)
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            self._db = sqlite_utils.Database(conn)
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise store_error(self.path, exc) from None
        except OSError as exc:
            raise StoreError(f"cannot open state database {self.path}: {exc.strerror or exc}") from None

    def pending_migrations(self) -> list[str]:
        """Names of the migrations this database has not had yet (none after opening it)."""
        return [m.name for m in MIGRATIONS.pending(self._db)]

    def _migrate(self) -> None:
        if not MIGRATIONS.pending(self._db):
            return
        with self.write():  # BEGIN IMMEDIATE: two processes opening a new db migrate once
            MIGRATIONS.apply(self._db)

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        """One short write transaction, taking the write lock up front (BEGIN IMMEDIATE) so a
        read-then-write never fails halfway on a lock upgrade; nested calls are savepoints."""
        if self.read_only is not None:
            raise StoreError(f"cannot write state database {self.path}: opened read-only, {self.read_only}")
        conn = self._db.conn
        if conn.in_transaction:
            with self._db.atomic():
                yield
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as exc:
            raise store_error(self.path, exc) from None
        try:
            yield
        except sqlite3.DatabaseError as exc:  # a statement of the body (a full disk, say)
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise store_error(self.path, exc) from None
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        else:
            try:
                conn.execute("COMMIT")
            except sqlite3.DatabaseError as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise store_error(self.path, exc) from None

    def query(self, sql: str, params: Any = ()) -> list[dict[str, Any]]:
        try:
            return list(self._db.query(sql, params))
        except sqlite3.DatabaseError as exc:
            raise store_error(self.path, exc) from None

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        """One statement (inside `write()` for a change), its failure as StoreError."""
        try:
            return self._db.conn.execute(sql, params)
        except sqlite3.DatabaseError as exc:
            raise store_error(self.path, exc) from None

    def executemany(self, sql: str, rows: Any) -> sqlite3.Cursor:
        try:
            return self._db.conn.executemany(sql, rows)
        except sqlite3.DatabaseError as exc:
            raise store_error(self.path, exc) from None

    def iter_rows(self, sql: str, params: Any = (), batch: int = 500) -> Iterator[tuple[Any, ...]]:
        """Rows as plain tuples, in the order selected, fetched `batch` at a time (memory stays
        flat whatever the number of rows): for typed rows built by position."""
        try:
            cursor = self._db.conn.execute(sql, params)
            while rows := cursor.fetchmany(batch):
                yield from rows
        except sqlite3.DatabaseError as exc:
            raise store_error(self.path, exc) from None

    def now_s(self) -> float:
        return self.clock.now_s()

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


READ_ONLY_FS = "its filesystem is read-only"


def _not_writable(path: Path) -> str | None:
    """Why an existing state.db cannot be written here (its filesystem is read-only, the file is
    read-only or immutable); None when it can."""
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return READ_ONLY_FS
    except OSError:
        return None  # not ours to judge: the normal open says what is wrong
    if not os.access(path, os.W_OK):
        return f"the file is read-only or immutable (`lsattr {path}`)"
    return None


def _open_read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection: `mode=ro` where SQLite can share the WAL's index, else
    `immutable=1` (a WAL left with writes in it is then refused: they would be unseen)."""
    uri = "file:" + urllib.parse.quote(str(path.absolute()))
    conn: sqlite3.Connection | None = None
    try:
        conn = sqlite3.connect(uri + "?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.DatabaseError:
        if conn is not None:
            conn.close()
    wal = Path(f"{path}-wal")
    if wal.exists() and wal.stat().st_size > 0:
        raise StoreError(f"cannot read state database {path}: it is read-only here and {wal.name} holds writes "
                         "not yet merged into it; copy the folder somewhere writable and read the copy")
    try:
        conn = sqlite3.connect(uri + "?immutable=1", uri=True, check_same_thread=False)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        raise StoreError(describe_sqlite_error(path, exc, reading=True)) from None
    return conn


NEW_FILE_S = 60.0  # a 0-byte state.db younger than this is one being created right now


def _refuse_emptied(path: Path) -> None:
    """SQLite takes a 0-byte file for a new, empty database. One that is not new was a
    database once (truncated, or replaced by an empty file): refuse it rather than start
    afresh over its history without a word."""
    info = path.stat()
    if info.st_size == 0 and time.time() - info.st_mtime > NEW_FILE_S:
        raise StoreError(
            f"state database {path} is empty (0 bytes) but not new: its history is gone; "
            "move it aside (or delete it) to start a new one"
        )


def _enable_wal(conn: sqlite3.Connection) -> None:
    """WAL is a property of the file, set once. Switching to it needs a moment alone with the
    file, and SQLite answers SQLITE_BUSY at once (no busy handler) when several processes open
    a new state.db together, so retry until the busy timeout."""
    deadline_s = time.monotonic() + BUSY_TIMEOUT_S
    delay_s = 0.005
    while True:
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if ("locked" not in str(exc) and "busy" not in str(exc)) or time.monotonic() > deadline_s:
                raise
        time.sleep(delay_s)  # another process is switching the file right now
        delay_s = min(delay_s * 2, 0.1)


def store_error(path: Path, exc: sqlite3.DatabaseError) -> StoreError:
    """sqlite3's error as ours: DatabaseDiskFull for a full filesystem, else StoreError."""
    if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "database or disk is full" in str(exc):
        return DatabaseDiskFull(f"state database {path}: its disk is full ({exc}); free space there")
    return StoreError(describe_sqlite_error(path, exc))


def describe_sqlite_error(path: Path, exc: sqlite3.DatabaseError, *, reading: bool = False) -> str:
    """One line for sqlite's error; `reading`: it came from a read-only open (no write was asked)."""
    text = str(exc)
    if "locked" in text or "busy" in text:
        return (
            f"state database {path} is locked by another process for more than "
            f"{BUSY_TIMEOUT_S:.0f} s; try again, or check for a stuck orch process"
        )
    if "not a database" in text or "malformed" in text or "file is encrypted" in text:
        return f"state database {path} is corrupt or not an orch database ({text}); move it aside and resubmit"
    if "readonly" in text and path.exists() and not os.access(path, os.W_OK):
        return (
            f"cannot write state database {path}: the file is read-only or immutable (`lsattr {path}`); "
            f"make it writable (`chmod u+w`, `chattr -i`) or pass another --db"
        )
    if "readonly" in text and not reading:
        return f"cannot write state database {path} ({text}); check the directory's permissions"
    if "readonly" in text or "unable to open" in text:
        return f"cannot open state database {path} ({text}); check its and its directory's permissions"
    return f"state database {path}: {text}"


def now_s() -> float:
    """Wall time where no store is at hand (what the CLI shows); a store's rows use `store.now_s()`."""
    return time.time()
