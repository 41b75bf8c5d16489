"""An archived sweep on a read-only filesystem: every reader works (`orch jobs`, `orch results`,
`Sweep.jobs()`), and a write is refused in one line that says it is a write."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator.api import Sweep
from orchestrator.errors import StoreError
from orchestrator.store.db import Store
from tests.conftest import OrchRunner
from tests.hostile_helpers import small_tmpfs
from tests.test_metric_history import _store


def _read_only(folder: Path) -> None:
    remounted = subprocess.run(
        ["mount", "-o", "remount,ro", str(folder)], capture_output=True, check=False
    )
    if remounted.returncode != 0:
        pytest.skip(f"cannot remount read-only here: {remounted.stderr.decode().strip()}")


def test_readers_work_on_a_database_on_a_read_only_filesystem(
    tmp_path: Path, orch_inproc: OrchRunner
) -> None:
    with small_tmpfs(tmp_path / "archive", 16) as archive:
        _store(archive).close()  # one succeeded job, as an archived sweep holds it
        db = archive / "state.db"
        _read_only(archive)
        listed = orch_inproc("jobs", "--db", str(db), "--json")
        assert listed.rc == 0, listed.stderr
        assert '"state": "succeeded"' in listed.stdout
        results = orch_inproc("results", "--db", str(db))
        assert results.rc == 0 and "cannot" not in results.stderr, results.stderr
        for reader in (("status",), ("show", "1"), ("curves", "--job", "1"), ("memory",)):
            read = orch_inproc(*reader, "--db", str(db))
            assert read.rc == 0 and "cannot" not in read.stderr, (reader, read.stderr)
        frame = Sweep(db).jobs(as_frame=False)
        assert [row["state"] for row in frame] == ["succeeded"]
        with Store(db, create=False) as store, pytest.raises(StoreError) as refused, store.write():
            pass
        assert str(refused.value) == (
            f"cannot write state database {db}: opened read-only, its filesystem is read-only"
        )
        resumed = orch_inproc("resume", "E1", "--db", str(db))  # a write: refused, in its words
        assert resumed.rc != 0 and resumed.stderr.strip() == (
            f"orch: error: cannot write state database {db}: opened read-only, its filesystem is read-only"
        )
        assert not any(p.name.endswith(("-wal", "-shm")) for p in archive.iterdir())


def test_a_writer_on_a_read_only_filesystem_says_write_not_open(tmp_path: Path) -> None:
    # `orch daemon run` and `orch submit` said "cannot open ... check permissions"
    with small_tmpfs(tmp_path / "archive", 16) as archive:
        _store(archive).close()
        db = archive / "state.db"
        _read_only(archive)
        with pytest.raises(StoreError) as refused:
            Store(db)  # a writer's open (create=True), as the daemon and submit open it
        said = str(refused.value)
        assert said == f"cannot write state database {db}: its filesystem is read-only"
