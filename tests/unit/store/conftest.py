import pytest

from otel_gpu.store.schema import open_reader
from otel_gpu.store.exporter import StoreExporter
from store_helpers import T0


@pytest.fixture
def db(tmp_path):
    return str(tmp_path / "store" / "otel-gpu.db")


@pytest.fixture
def clock():
    """A settable wall clock for the store's retention (epoch ns)."""
    class Clock:
        now = T0 + 3600 * 10**9

        def __call__(self):
            return self.now
    return Clock()


@pytest.fixture
def store(db, clock):
    s = StoreExporter(db, now_ns=clock)
    yield s
    s.shutdown()


@pytest.fixture
def reader(db):
    conns = []

    def open_():
        conns.append(open_reader(db))
        return conns[-1]
    yield open_
    for c in conns:
        c.close()
