"""The membership state file and its lock (fastrebalance/_membership.py): only a process
that is gone is ever reported dead, whatever its pid, and a write cut short leaves a
readable entry.

Other processes are real (``subprocess``): a flock is the kernel's, and only another
process's death (SIGKILL) shows that the kernel releases it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastrebalance._membership import (
    Membership,
    Registration,
    default_state_dir,
    find_dead,
    group_key,
    prepare_dir,
)

KEY = group_key("127.0.0.1:9092", "orders")
ME = Membership("orders", "member-1", None, "classic", "127.0.0.1:9092")

#: A process that registers, records a membership, says so, then sleeps until killed.
_HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from fastrebalance._membership import Membership, Registration
    reg = Registration(Path(sys.argv[1]), sys.argv[2])
    reg.record(Membership("orders", sys.argv[3], None, "classic", "127.0.0.1:9092"))
    print(reg.name, flush=True)
    time.sleep(600)
    """
)


class Holder:
    """Another process holding an entry of group ``KEY``."""

    def __init__(self, directory: Path, member_id: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(directory), KEY, member_id],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.name = self.proc.stdout.readline().strip()  # bounded: the process writes it
        assert self.name, "the holder process did not register"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(30)


@pytest.fixture
def holders(tmp_path: Path) -> Iterator[list[Holder]]:
    made: list[Holder] = []
    yield made
    for h in made:
        if h.proc.poll() is None:
            h.proc.send_signal(signal.SIGCONT)
            h.kill()


def spawn(made: list[Holder], directory: Path, member_id: str) -> Holder:
    h = Holder(directory, member_id)
    made.append(h)
    return h


def test_a_live_process_is_never_dead_and_a_killed_one_is(
    tmp_path: Path, holders: list[Holder]
) -> None:
    a = spawn(holders, tmp_path, "member-a")
    b = spawn(holders, tmp_path, "member-b")
    assert find_dead(tmp_path, KEY) == []
    a.kill()
    dead = find_dead(tmp_path, KEY)
    assert [e.name for e in dead] == [a.name]
    assert dead[0].membership is not None and dead[0].membership.member_id == "member-a"
    dead[0].discard()
    assert not list(tmp_path.glob(a.name + "*"))
    assert (tmp_path / (b.name + ".lock")).exists()  # the live one is untouched
    assert find_dead(tmp_path, KEY) == []


def test_a_stopped_process_holds_its_lock(tmp_path: Path, holders: list[Holder]) -> None:
    a = spawn(holders, tmp_path, "member-a")
    a.proc.send_signal(signal.SIGSTOP)
    try:
        assert find_dead(tmp_path, KEY) == []  # stopped is not dead
    finally:
        a.proc.send_signal(signal.SIGCONT)
    a.kill()
    assert [e.name for e in find_dead(tmp_path, KEY)] == [a.name]


def test_a_pid_reused_by_a_live_process_does_not_keep_the_dead_alive(
    tmp_path: Path, holders: list[Holder]
) -> None:
    """The pid in the file is for people: here it names this very (live) process, as after
    a container restart where every process is pid 1. The free lock decides."""
    a = spawn(holders, tmp_path, "member-a")
    a.kill()
    data = tmp_path / (a.name + ".json")
    doc = json.loads(data.read_text())
    doc["pid"] = os.getpid()
    data.write_text(json.dumps(doc))
    dead = find_dead(tmp_path, KEY)
    assert [e.name for e in dead] == [a.name]
    assert dead[0].membership is not None and dead[0].membership.pid == os.getpid()


def test_two_starters_never_take_the_same_dead_entry(tmp_path: Path, holders: list[Holder]) -> None:
    a = spawn(holders, tmp_path, "member-a")
    a.kill()
    first = find_dead(tmp_path, KEY)
    assert len(first) == 1
    assert find_dead(tmp_path, KEY) == []  # the first starter holds its lock
    first[0].discard()
    assert find_dead(tmp_path, KEY) == []


def test_own_entries_are_alive_in_the_same_process(tmp_path: Path) -> None:
    """flock locks belong to open files: a second consumer of this process cannot take
    the first one's lock either."""
    reg = Registration(tmp_path, KEY)
    reg.record(ME)
    assert find_dead(tmp_path, KEY) == []
    reg.close(forget=False)  # released without leaving: dead for the next start
    dead = find_dead(tmp_path, KEY)
    assert [e.membership for e in dead] == [dead[0].membership]
    assert dead[0].membership is not None and dead[0].membership.member_id == "member-1"
    dead[0].discard()


def test_close_forgets_the_entry(tmp_path: Path) -> None:
    reg = Registration(tmp_path, KEY)
    reg.record(ME)
    reg.close()
    assert list(tmp_path.iterdir()) == []


def test_other_groups_are_not_touched(tmp_path: Path) -> None:
    other = Registration(tmp_path, group_key("127.0.0.1:9092", "payments"))
    other.record(ME)
    other.close(forget=False)
    assert find_dead(tmp_path, KEY) == []


def test_record_writes_only_changes(tmp_path: Path) -> None:
    reg = Registration(tmp_path, KEY)
    assert reg.record(ME)
    assert not reg.record(ME)
    assert reg.record(Membership("orders", "member-2", None, "classic", "127.0.0.1:9092"))
    reg.close(forget=False)
    (entry,) = find_dead(tmp_path, KEY)
    assert entry.membership is not None and entry.membership.member_id == "member-2"
    entry.discard()


def test_a_write_cut_short_leaves_the_previous_membership(tmp_path: Path) -> None:
    """A crash between writing the temporary file and renaming it: the entry reads as
    the last complete write, and the stray file goes with the entry."""
    reg = Registration(tmp_path, KEY)
    reg.record(ME)
    stray = tmp_path / (reg.name + ".json.abc123.tmp")
    stray.write_text('{"group_id": "orders", "member_id": "mem')  # cut mid-write
    reg.close(forget=False)
    (entry,) = find_dead(tmp_path, KEY)
    assert entry.membership is not None and entry.membership.member_id == "member-1"
    entry.discard()
    assert list(tmp_path.iterdir()) == []


def test_a_damaged_entry_is_dead_with_nothing_known(tmp_path: Path) -> None:
    reg = Registration(tmp_path, KEY)
    reg.record(ME)
    reg.data_path.write_text("not json")
    reg.close(forget=False)
    (entry,) = find_dead(tmp_path, KEY)
    assert entry.membership is None
    entry.discard()


def test_an_abandoned_temporary_lock_file_is_removed_once_old(tmp_path: Path) -> None:
    """A process killed between creating its lock file and renaming it into place."""
    abandoned = tmp_path / ".lock-xyz.tmp"
    abandoned.write_text("")
    assert find_dead(tmp_path, KEY, stale_tmp_s=60.0) == []
    assert abandoned.exists()  # young: it may be a creator about to lock it
    old = time.time() - 120
    os.utime(abandoned, (old, old))
    find_dead(tmp_path, KEY, stale_tmp_s=60.0)
    assert not abandoned.exists()


def test_prepare_dir_refuses_what_cannot_hold_files(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(OSError):
        prepare_dir(blocker / "state")
    prepare_dir(tmp_path / "new" / "state")
    assert (tmp_path / "new" / "state").is_dir()
    assert list((tmp_path / "new" / "state").iterdir()) == []


def test_default_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("FASTREBALANCE_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert default_state_dir() == tmp_path / "fastrebalance"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/ignored")  # the XDG spec: absolute only
    assert default_state_dir() == Path.home() / ".local" / "state" / "fastrebalance"
    monkeypatch.setenv("FASTREBALANCE_STATE_DIR", str(tmp_path / "vol"))
    assert default_state_dir() == tmp_path / "vol"


_text = st.text(min_size=1, max_size=30)


@given(
    st.builds(
        Membership,
        group_id=_text,
        member_id=_text,
        instance_id=st.none() | _text,
        protocol=st.sampled_from(["classic", "consumer"]),
        bootstrap=_text,
        pid=st.integers(0, 2**22),
        host=st.text(max_size=20),
        updated=st.floats(0, 2e9),
    )
)
def test_membership_round_trips(m: Membership) -> None:
    from dataclasses import asdict

    assert Membership.parse(json.dumps(asdict(m))) == m


@given(
    st.lists(
        st.from_regex(r"[a-z0-9.-]{1,12}:[0-9]{1,5}", fullmatch=True),
        min_size=1,
        max_size=4,
        unique=True,
    ),
    st.randoms(),
)
def test_group_key_ignores_the_spelling_of_the_bootstrap_list(
    servers: list[str], rnd: object
) -> None:
    shuffled = list(servers)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    spelled = " , ".join(s.upper() for s in shuffled)
    assert group_key(spelled, "g") == group_key(",".join(servers), "g")
    assert group_key(",".join(servers), "g") != group_key(",".join(servers), "h")
