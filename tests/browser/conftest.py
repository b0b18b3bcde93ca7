import pytest

from tests.browser import chromium
from tests.browser.demo_store import build_demo_store


@pytest.fixture(scope="session")
def browser():
    why = chromium.missing()
    if why:
        print(f"browser tests skipped: {why}")
        pytest.skip(why)
    driver = chromium.start()
    yield driver
    driver.quit()


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    db = str(tmp_path_factory.mktemp("browser") / "otel-gpu.db")
    return db, build_demo_store(db)
