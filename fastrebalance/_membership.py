"""Who died: each member's group membership in a state file, its life proven by a lock.

A consumer in the mode records its membership (group id, member id, ``group.instance.id``,
protocol, bootstrap) in ``<dir>/<key>.<id>.json``, and holds an exclusive ``fcntl.flock``
on ``<dir>/<key>.<id>.lock`` for as long as it runs. The kernel releases the lock when the
process dies, whatever kills it (SIGKILL, the OOM killer, a panic in native code), so a
lock anyone can take belongs to a process that is gone: that is the whole proof of death.
Pids are recorded for people, never trusted (a container's process is pid 1 after every
restart, and a pid is reused by unrelated processes).

Why two files: the membership changes (a new member id after a rejoin) and is replaced
atomically (tmp + rename), and a rename puts a new inode under the name, while a flock
belongs to the inode. The lock file is never replaced: it is created under a temporary
name, locked, and only then renamed into place, so a scanner never sees an unlocked lock
file of a live process.

A crash in the middle of a write leaves the previous membership (or none) plus a stray
``.tmp`` file, removed with the entry. Nothing is fsynced: the files must outlive a process,
not the machine (after a reboot every session has long expired).

Everything here is local file I/O, no Kafka: ``_eviction`` does the removal.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import socket
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

__all__ = [
    "DeadEntry",
    "Membership",
    "Registration",
    "default_state_dir",
    "find_dead",
    "group_key",
    "prepare_dir",
]

#: The environment variable that moves the default state directory (a container's volume).
STATE_DIR_ENV = "FASTREBALANCE_STATE_DIR"
_LOCK = ".lock"
_DATA = ".json"


def default_state_dir() -> Path:
    """``$FASTREBALANCE_STATE_DIR``, else ``$XDG_STATE_HOME/fastrebalance``, else
    ``~/.local/state/fastrebalance``: per user, so that one user's consumers never read or
    lock another's files."""
    if env := os.environ.get(STATE_DIR_ENV):
        return Path(env)
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "state"
    return base / "fastrebalance"


def prepare_dir(path: Path) -> None:
    """Create ``path`` (mode 0700) and prove it writable by creating and locking a file.

    Raises:
        OSError: it cannot be created, written or locked (with the reason).
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".probe-", dir=path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)


def group_key(bootstrap: str, group_id: str) -> str:
    """The file-name prefix of one group of one cluster: entries of other groups (or of
    the same group id on another cluster) are never opened."""
    servers = sorted(s.strip().lower() for s in bootstrap.split(",") if s.strip())
    digest = hashlib.sha256((",".join(servers) + "\n" + group_id).encode("utf-8"))
    return digest.hexdigest()[:20]


@dataclass(frozen=True)
class Membership:
    """What a live member records about itself, and what a dead one leaves."""

    group_id: str
    member_id: str
    instance_id: str | None
    protocol: str  # "classic" or "consumer"
    bootstrap: str
    pid: int = 0
    host: str = ""
    updated: float = 0.0  # wall clock (epoch seconds) of the last write

    @classmethod
    def parse(cls, text: str) -> Membership | None:
        """A membership read back, or None if the text is not one (a file from another
        version, or damaged other than by our writes, which are atomic)."""
        try:
            data = json.loads(text)
            return cls(
                group_id=str(data["group_id"]),
                member_id=str(data["member_id"]),
                instance_id=None if data.get("instance_id") is None else str(data["instance_id"]),
                protocol=str(data["protocol"]),
                bootstrap=str(data["bootstrap"]),
                pid=int(data.get("pid", 0)),
                host=str(data.get("host", "")),
                updated=float(data.get("updated", 0.0)),
            )
        except (ValueError, KeyError, TypeError):
            return None


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class Registration:
    """This process's entry: the lock held from creation to ``close()`` (or death), and
    the membership file rewritten when the membership changes.

    Owned by the thread that owns the consumer (written from its rebalance callbacks).
    """

    def __init__(self, directory: Path, key: str) -> None:
        self.directory = directory
        self.name = f"{key}.{uuid.uuid4().hex}"
        self.lock_path = directory / (self.name + _LOCK)
        self.data_path = directory / (self.name + _DATA)
        self._last: Membership | None = None
        # Locked under a temporary name, then renamed: never visible unlocked. A scanner
        # may unlink an unlocked temporary file of ours between mkstemp and flock (it
        # cannot tell it from a crashed creator's): then the rename fails, and we retry.
        for _ in range(5):
            fd, tmp = tempfile.mkstemp(prefix=".lock-", suffix=".tmp", dir=directory)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.rename(tmp, self.lock_path)
            except OSError:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                continue
            self._fd: int | None = fd
            return
        raise OSError(errno.EAGAIN, f"could not create a lock file in {directory}")

    def record(self, membership: Membership) -> bool:
        """Write ``membership`` if it changed (True if written)."""
        if self._fd is None:
            return False
        same = self._last is not None and (
            self._last.member_id,
            self._last.instance_id,
            self._last.protocol,
        ) == (membership.member_id, membership.instance_id, membership.protocol)
        if same:
            return False
        stamped = replace(
            membership, pid=os.getpid(), host=socket.gethostname(), updated=time.time()
        )
        _write_atomically(self.data_path, json.dumps(asdict(stamped), sort_keys=True))
        self._last = stamped
        return True

    def close(self, forget: bool = True) -> None:
        """Release the lock; with ``forget``, remove the entry first (the member left the
        group). Without it the entry stays, dead, for the next start to remove."""
        if self._fd is None:
            return
        if forget:
            for path in (self.data_path, self.lock_path):
                with contextlib.suppress(OSError):
                    os.unlink(path)
        os.close(self._fd)
        self._fd = None


@dataclass
class DeadEntry:
    """An entry whose lock we took: its process is gone. We hold its lock until
    ``discard()`` so that no other starting process handles it at the same time."""

    name: str
    membership: Membership | None
    directory: Path
    fd: int | None

    def discard(self) -> None:
        """Remove the entry's files (and a stray tmp of a write cut short), then release."""
        if self.fd is None:
            return
        for path in self.directory.glob(self.name + "*"):
            with contextlib.suppress(OSError):
                path.unlink()
        os.close(self.fd)
        self.fd = None

    def release(self) -> None:
        """Keep the entry for someone else (not ours to handle), releasing its lock."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _try_lock(path: Path) -> int | None:
    """An fd holding ``path``'s exclusive lock, or None if a live process holds it (or the
    file went away meanwhile, or was replaced: then it is not the entry we looked at)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.fstat(fd).st_ino != os.stat(path).st_ino:
            raise FileNotFoundError(path)  # removed by another starter after we opened it
    except OSError:
        os.close(fd)
        return None
    return fd


def find_dead(directory: Path, key: str, stale_tmp_s: float = 60.0) -> list[DeadEntry]:
    """Every entry of group ``key`` in ``directory`` whose process is dead, each with its
    lock held by the caller. An entry that a live process holds is never returned
    (a stopped process, SIGSTOP, still holds its lock: it is alive).

    Also removes temporary lock files left by a process that died while creating its
    entry (unlocked and older than ``stale_tmp_s``).
    """
    dead = []
    try:
        names = sorted(p.name for p in directory.iterdir())
    except OSError:
        return []
    now = time.time()
    for name in names:
        path = directory / name
        if name.startswith(".lock-") and name.endswith(".tmp"):
            fd = _try_lock(path)
            if fd is not None:
                with contextlib.suppress(OSError):
                    if now - os.fstat(fd).st_mtime > stale_tmp_s:
                        path.unlink()
                os.close(fd)
            continue
        if not (name.startswith(key + ".") and name.endswith(_LOCK)):
            continue
        fd = _try_lock(path)
        if fd is None:
            continue
        entry = name[: -len(_LOCK)]
        membership: Membership | None = None
        with contextlib.suppress(OSError):
            membership = Membership.parse((directory / (entry + _DATA)).read_text("utf-8"))
        dead.append(DeadEntry(entry, membership, directory, fd))
    return dead


def describe(entry: DeadEntry) -> dict[str, Any]:
    """A dead entry as plain data, for logs and status."""
    m = entry.membership
    if m is None:
        return {"entry": entry.name}
    return {
        "member_id": m.member_id,
        "group_instance_id": m.instance_id,
        "protocol": m.protocol,
        "pid": m.pid,
        "host": m.host,
        "recorded_at": m.updated,
    }
