"""otel_gpu.proc against a fake /proc tree: awkward command names, missing entries."""
import os

import pytest

from otel_gpu import proc

PID = 4242


def stat_line(pid: int, comm: str, start: int) -> str:
    fields = ["S", "1", str(pid), str(pid), "0", "-1", "4194560"] + ["0"] * 45
    fields[19] = str(start)  # fields[0] is field 3, so this is field 22
    return f"{pid} ({comm}) " + " ".join(fields) + "\n"


@pytest.fixture
def root(tmp_path):
    d = tmp_path / str(PID)
    d.mkdir()
    (d / "stat").write_text(stat_line(PID, "py (worker) ) x", 98765))
    (d / "comm").write_text("py (worker) ) x\n")
    (d / "cmdline").write_bytes(b"python3\0-m\0app server\0")
    (d / "environ").write_bytes(b"PATH=/bin\0OTEL_SERVICE_NAME=shop=1\0NOEQUALS\0OTEL_X=\0")
    (d / "maps").write_text("7f00-7f01 r-xp 0 08:01 12 /usr/lib/libcudart.so.12\n")
    os.symlink("/usr/bin/python3.11 (deleted)", d / "exe")
    (d / "fd").mkdir()
    os.symlink("socket:[31337]", d / "fd" / "3")
    os.symlink("/dev/null", d / "fd" / "4")
    (d / "net").mkdir()
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    (d / "net" / "tcp").write_text(header + "   0: 0100007F:1F90 00000000:0000 0A 0:0 00:0 0 1000 0 11111 1\n")
    (d / "net" / "tcp6").write_text(header + "   0: 00000000000000000000000000000000:2382 "
                                    "00000000000000000000000000000000:0000 0A 0:0 00:0 0 0 0 31337 1\n")
    (tmp_path / "self").mkdir()
    return str(tmp_path)


def test_start_time_counts_fields_after_the_last_parenthesis(root):
    assert proc.start_time(root, PID) == 98765


@pytest.mark.parametrize("text", ["", "4242 (x) S 1 2\n", "4242 x S " + "0 " * 30 + "\n",
                                  stat_line(PID, "x", "abc")], ids=["empty", "short", "no-paren", "not-int"])
def test_start_time_of_a_malformed_stat_is_none(root, text):
    with open(os.path.join(root, str(PID), "stat"), "w") as f:
        f.write(text)
    assert proc.start_time(root, PID) is None


def test_comm_keeps_spaces_and_parentheses(root):
    assert proc.comm(root, PID) == "py (worker) ) x"


def test_exe_is_the_link_as_the_kernel_gives_it(root):
    assert proc.exe(root, PID) == "/usr/bin/python3.11" + proc.DELETED


def test_cmdline_and_environ(root):
    assert proc.cmdline(root, PID) == ["python3", "-m", "app server"]
    assert proc.environ(root, PID, ["OTEL_SERVICE_NAME", "OTEL_X", "NOEQUALS", "HOME"]) == {
        "OTEL_SERVICE_NAME": "shop=1", "OTEL_X": ""}


def test_maps_and_pids(root):
    assert proc.maps(root, PID).endswith("/usr/lib/libcudart.so.12\n")
    assert proc.pids(root) == [PID]
    assert proc.pids(os.path.join(root, "missing")) == []


def test_socket_inode_and_local_port(root):
    assert proc.socket_inode(root, PID, 3) == 31337
    assert proc.socket_inode(root, PID, 4) is None  # not a socket
    assert proc.local_port(root, PID, 3) == 0x2382  # found in tcp6
    assert proc.local_port(root, PID, 9) is None


def test_a_gone_process_reads_as_none(root):
    gone = 999
    assert proc.start_time(root, gone) is None
    assert proc.comm(root, gone) is None
    assert proc.exe(root, gone) is None
    assert proc.cmdline(root, gone) is None
    assert proc.environ(root, gone, ["A"]) is None
    assert proc.maps(root, gone) is None
    assert proc.socket_inode(root, gone, 3) is None
    assert proc.local_port(root, gone, 3) is None
    with pytest.raises(FileNotFoundError):
        proc.read(root, gone, "cgroup")


def test_an_empty_cmdline_is_not_unreadable(root):
    open(os.path.join(root, str(PID), "cmdline"), "wb").close()  # kernel thread, zombie
    assert proc.cmdline(root, PID) == []


def test_a_directory_where_a_file_should_be_reads_as_none(root):
    d = os.path.join(root, str(PID))
    os.unlink(os.path.join(d, "comm"))
    os.mkdir(os.path.join(d, "comm"))
    assert proc.comm(root, PID) is None
    with pytest.raises(OSError):
        proc.read_text(root, PID, "comm")


def test_reads_the_real_proc_of_this_process():
    pid = os.getpid()
    assert proc.start_time("/proc", pid) > 0
    assert proc.cmdline("/proc", pid)
    assert proc.exe("/proc", pid)


TCP_HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def test_tcp_rows_decode_host_order_addresses(root):
    d = os.path.join(root, str(PID), "net")
    with open(os.path.join(d, "tcp"), "w") as f:
        f.write(TCP_HEADER + "   0: 0100007F:1F90 0A00000A:C350 01 0:0 00:0 0 0 0 4242 1\n"
                "   1: garbage\n")
    with open(os.path.join(d, "tcp6"), "w") as f:  # ::ffff:10.0.0.9 port 443, established
        f.write(TCP_HEADER + "   0: 0000000000000000FFFF00000900000A:01BB "
                "00000000000000000000000001000000:0050 01 0:0 00:0 0 0 0 77 1\n")
    (a, b) = proc.tcp_sockets(root, PID)
    assert (a.local_addr, a.local_port, a.peer_addr, a.peer_port, a.state, a.inode) == \
        ("127.0.0.1", 8080, "10.0.0.10", 50000, proc.TCP_ESTABLISHED, 4242)
    assert (b.local_addr, b.local_port, b.peer_addr, b.peer_port) == ("10.0.0.9", 443, "::1", 80)


def test_socket_fds_map_inodes_to_fds(root):
    assert proc.socket_fds(root, PID) == {31337: 3}
    assert proc.socket_fds(root, 999) == {}


def test_listening_sockets_stop_at_the_first_other_row(root):
    """The kernel prints its listening hash first: the read stops there (a neighbour's
    tens of thousands of connections are never read), in both tables."""
    d = os.path.join(root, str(PID), "net")
    with open(os.path.join(d, "tcp"), "w") as f:
        f.write(TCP_HEADER + "   0: 0100007F:1F90 00000000:0000 0A 0:0 00:0 0 0 0 11 1\n"
                "   1: 0100007F:1F91 00000000:0000 0A 0:0 00:0 0 0 0 12 1\n"
                "   2: 0100007F:1F90 0A00000A:C350 01 0:0 00:0 0 0 0 13 1\n"
                "   3: 0100007F:1F92 00000000:0000 0A 0:0 00:0 0 0 0 14 1\n")  # not a real table's order
    assert [s.inode for s in proc.listening_sockets(root, PID)] == [11, 12, 31337]
    assert [s.inode for s in proc.listening_sockets(root, 999)] == []


def test_sockets_held_in_descriptor_order(root):
    os.symlink("socket:[5]", os.path.join(root, str(PID), "fd", "10"))
    assert list(proc.sockets_held(root, PID)) == [(3, 31337), (10, 5)]
    assert list(proc.sockets_held(root, 999)) == []
