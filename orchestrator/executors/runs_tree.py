"""The runs tree on disk, reached without ever following a symlink.

Run dirs are `runs/<suite>/<job>/attempt-N` beside state.db. User code writes inside them, and
the directory holding state.db may be shared (a 1777 scratch dir), so nothing here trusts a
path: the runs dir must be a real directory owned by us and writable by nobody else, and every
level below it is opened with O_NOFOLLOW relative to its parent's descriptor (openat), so a
symlink planted anywhere in the tree is refused instead of followed. Files are opened the
same way, must be regular files, and are read up to a size limit.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from orchestrator.errors import LauncherError, OrchShortOf, is_orch_shortage

RUN_DIR_DEPTH = 3  # <suite>/<job>/attempt-N below the runs dir
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO never hangs us


class RunTreeError(LauncherError):
    """The runs tree is not safe to use: a symlink, a foreign owner, a world-writable dir."""


class RunTreeShortOf(RunTreeError, OrchShortOf):
    """The runs tree could not be opened for want of descriptors or memory: orch's shortage."""


class FileProblem(Exception):
    """A run-dir file that is not a readable regular file of sane size; str() says why."""


def check_runs_root(runs_dir: Path, *, create: bool) -> None:
    """Refuse a runs dir that is a symlink, not a directory, not ours, or writable by others;
    create it (0700) when missing and `create`."""
    fd = open_runs_root(runs_dir, create=create)
    if fd is not None:
        os.close(fd)


def open_runs_root(runs_dir: Path, *, create: bool) -> int | None:
    """A descriptor of the checked runs dir; None when it does not exist and not `create`."""
    runs_dir = Path(runs_dir)
    try:
        fd = os.open(runs_dir, _DIR_FLAGS)
    except FileNotFoundError:
        if not create:
            return None
        with contextlib.suppress(FileExistsError):
            os.mkdir(runs_dir, 0o700)
        fd = _open_dir(runs_dir)
    except OSError as exc:
        raise _refusal(runs_dir, exc) from None
    try:
        _check_dir(fd, runs_dir, root=True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_dir(path: Path) -> int:
    try:
        return os.open(path, _DIR_FLAGS)
    except OSError as exc:
        raise _refusal(path, exc) from None


def _refusal(path: Path, exc: OSError) -> RunTreeError:
    """What a directory of the runs tree that could not be opened is refused with."""
    return (RunTreeShortOf if is_orch_shortage(exc) else RunTreeError)(_why_not_dir(path, exc))


def _why_not_dir(path: Path, exc: OSError) -> str:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        kind = "a symlink" if os.path.islink(path) else "not a directory"
        return f"refusing {path}: it is {kind}; orch never follows links in its runs tree"
    return f"cannot open {path}: {exc.strerror or exc}"


def _check_dir(fd: int, path: Path, *, root: bool = False) -> None:
    info = os.fstat(fd)
    if info.st_uid != os.geteuid():
        raise RunTreeError(
            f"refusing {path}: it belongs to uid {info.st_uid}, not to this user ({os.geteuid()}); "
            "move it aside or use a --db in a directory of your own"
        )
    if root and info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise RunTreeError(
            f"refusing {path}: other users can write to it (mode {stat.S_IMODE(info.st_mode):o}); "
            f"`chmod 700 {path}`"
        )


def run_dir_parts(run_dir: Path) -> tuple[Path, tuple[str, ...]]:
    """(runs dir, the names below it) of an attempt's run dir."""
    run_dir = Path(run_dir)
    parts = run_dir.parts[-RUN_DIR_DEPTH:]
    return Path(*run_dir.parts[: -RUN_DIR_DEPTH]), tuple(parts)


@contextlib.contextmanager
def open_run_dir(run_dir: Path, *, create: bool = False) -> Iterator[int]:
    """A descriptor of the run dir, reached from the runs dir one O_NOFOLLOW level at a time.
    With `create`, missing levels are made 0700 and the run dir itself is set to 0700.
    Raises FileNotFoundError when it does not exist (and not `create`), RunTreeError when a
    level is a symlink, not a directory, or not ours."""
    root, names = run_dir_parts(run_dir)
    fd = open_runs_root(root, create=create)
    if fd is None:
        raise FileNotFoundError(errno.ENOENT, "no runs dir", str(root))
    fd, _path = _descend(fd, root, names, create=create)
    try:
        if create:
            os.fchmod(fd, 0o700)  # a dir that already existed keeps its old mode otherwise
        yield fd
    finally:
        os.close(fd)


def _descend(fd: int, path: Path, names: tuple[str, ...], *, create: bool) -> tuple[int, Path]:
    """The dir `names` below the dir `fd` (at `path`), reached one O_NOFOLLOW level at a time,
    each level checked as ours; with `create`, missing levels are made 0700. Takes `fd` over:
    returns the last level's descriptor and path, or raises (FileNotFoundError, RunTreeError)
    with every descriptor closed."""
    try:
        for name in names:
            path = path / name
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o700, dir_fd=fd)
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                raise
            except OSError as exc:
                raise _refusal(path, exc) from None
            os.close(fd)
            fd = child
            _check_dir(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd, path


def open_attempt_levels(run_dir: Path, *, create: bool) -> int:
    """A descriptor of the run dir for the wrapper, which may run where the runs dir was made
    by someone else's layout (a test's temp dir, a cluster's scratch): the runs dir is opened
    as given (only its last component not followed) and every level below it one O_NOFOLLOW
    step at a time, each ours; with `create`, missing levels are made 0700."""
    root, names = run_dir_parts(run_dir)
    return _descend(os.open(root, _DIR_FLAGS), root, names, create=create)[0]


def set_aside_stale(run_dir: Path) -> Path | None:
    """Rename a new attempt's run dir that already holds files to `attempt-N.stale-K` (the
    first K free) and return its new path; None when there is none, or it is empty.

    Job ids restart at 1 in a new database, so after `rm state.db` (or a second database in
    the same folder) attempt dirs of the old jobs sit where the new ones go: their result.json
    and exit.json would be read as the new attempt's. They are user output, so they are kept,
    not removed. Only a real directory is moved; a symlink there is refused by open_run_dir."""
    root, names = run_dir_parts(run_dir)
    fd = open_runs_root(root, create=False)
    if fd is None:
        return None
    try:
        fd, path = _descend(fd, root, names[:-1], create=False)
    except FileNotFoundError:
        return None
    try:
        leaf = names[-1]
        try:
            leaf_fd = os.open(leaf, _DIR_FLAGS, dir_fd=fd)
        except OSError:
            return None  # missing, or not a directory: open_run_dir says what is wrong
        try:
            if not os.listdir(leaf_fd):
                return None
        finally:
            os.close(leaf_fd)
        for k in range(1, 10_000):
            target = f"{leaf}.stale-{k}"
            try:
                os.stat(target, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                break
        else:
            raise RunTreeError(f"{path}: {leaf}.stale-1 to -9999 all exist; clear them out of the way")
        os.rename(leaf, target, src_dir_fd=fd, dst_dir_fd=fd)
        return Path(run_dir).with_name(target)
    finally:
        os.close(fd)


def read_file(dir_fd: int, name: str, max_bytes: int, *, tail: bool = False) -> bytes | None:
    """The file's bytes (its last `max_bytes` with `tail`); None when it does not exist.
    Raises FileProblem for a symlink, a non-regular file, or (without `tail`) one too large."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FileProblem(f"{name} is a symlink (not followed)") from None
        raise FileProblem(f"{name} cannot be read: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileProblem(f"{name} is {_kind(info.st_mode)}, not a regular file")
        if info.st_size > max_bytes and not tail:
            raise FileProblem(f"{name} is {info.st_size} bytes, more than the {max_bytes} allowed")
        if tail and info.st_size > max_bytes:
            os.lseek(fd, info.st_size - max_bytes, os.SEEK_SET)
        chunks: list[bytes] = []
        left = max_bytes + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:  # grew while we read
            if not tail:
                raise FileProblem(f"{name} is more than the {max_bytes} bytes allowed")
            data = data[-max_bytes:]
        return data
    finally:
        os.close(fd)


def file_mtime(dir_fd: int, name: str) -> float | None:
    """Modification time of a regular file (not followed if a symlink); None otherwise."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    return info.st_mtime if stat.S_ISREG(info.st_mode) else None


def exists(dir_fd: int, name: str) -> bool:
    """Whether anything (a symlink too) has that name in the dir."""
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def create_exclusive(dir_fd: int, name: str) -> bool:
    """Create an empty file; False when the name exists already (a symlink counts)."""
    try:
        os.close(
            os.open(
                name,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=dir_fd,
            )
        )
    except FileExistsError:
        return False
    return True


def _kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symlink"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


def open_regular_file(run_dir: Path, name: str) -> int:
    """A descriptor of a regular file in a run dir, reached without following any link.
    Raises FileNotFoundError, FileProblem (a link, FIFO, directory, ...) or RunTreeError."""
    with open_run_dir(Path(run_dir)) as dir_fd:
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            raise
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise FileProblem(f"{name} is a symlink (not followed)") from None
            raise FileProblem(f"{name} cannot be read: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise FileProblem(f"{name} is {_kind(mode)}, not a regular file")
    return fd
