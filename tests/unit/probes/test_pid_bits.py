import ctypes as ct

from otel_gpu.probes.pid_bits import PID_MAX_LIMIT, SLOW, TRACED, PidBits, pid_words


class Words(dict):
    """A map of u64 words as bcc's array reads them (missing index: 0)."""

    def __getitem__(self, key):
        return ct.c_uint64(self.get(key.value, 0))

    def __setitem__(self, key, value):
        dict.__setitem__(self, key.value, value.value)


def test_two_bits_per_pid_leave_the_neighbours_alone():
    words = Words()
    bits = PidBits(words, 4)
    bits.set(33, TRACED | SLOW)
    bits.set(34, TRACED)
    bits.set(63, SLOW)
    assert words == {1: 0b11 << 2 | 0b01 << 4 | 0b10 << 62}
    bits.set(33, TRACED)  # SLOW cleared, TRACED kept, 34 and 63 untouched
    bits.set(63, 0)
    assert words == {1: 0b01 << 2 | 0b01 << 4}
    bits.set(4 * 32, TRACED)  # beyond the array: the kernel's full path
    assert words == {1: 0b01 << 2 | 0b01 << 4}


def test_pid_words_follow_pid_max(tmp_path):
    f = tmp_path / "pid_max"
    f.write_text("32768\n")
    assert pid_words(str(f)) == 1024
    f.write_text("4194305\n")  # never past the kernel's limit
    assert pid_words(str(f)) == PID_MAX_LIMIT // 32
    f.write_text("junk")
    assert pid_words(str(f)) == PID_MAX_LIMIT // 32
    assert pid_words(str(tmp_path / "absent")) == PID_MAX_LIMIT // 32
