"""Makes the README's two pictures with the browser tests' own tooling (tests/browser):
a demo-like store, `otel-gpu report --html` shot in headless Chromium, and the slowest
trace's `otel-gpu traces --format perfetto` export shot in speedscope (offline).

    .venv/bin/python scripts/screenshots.py     # writes docs/html-report.png, docs/trace-view.png
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.browser import chromium  # noqa: E402
from tests.browser.demo_store import build_demo_store  # noqa: E402


def cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "otel_gpu.cli", *args], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def main() -> int:
    why = chromium.missing() or (None if chromium.SPEEDSCOPE.exists() else "no speedscope: run scripts/setup.sh")
    if why:
        print(f"screenshots: {why}", file=sys.stderr)
        return 1
    docs = ROOT / "docs"
    with tempfile.TemporaryDirectory() as tmp:
        db = f"{tmp}/otel-gpu.db"
        info = build_demo_store(db)
        cli("report", "--db", db, "--html", f"{tmp}/report.html")
        cli("traces", "--db", db, "--format", "perfetto", "--trace-id", info["slowest"]["trace_id"],
            "--output", f"{tmp}/trace.json")
        driver = chromium.start(width=1280, height=800)
        try:
            driver.get(Path(f"{tmp}/report.html").as_uri())
            chromium.full_page_png(driver, str(docs / "html-report.png"))
            driver.get(chromium.speedscope_page(f"{tmp}/trace.json", f"{tmp}/trace.js"))
            time.sleep(2)  # speedscope draws after the import
            driver.save_screenshot(str(docs / "trace-view.png"))
        finally:
            driver.quit()
    for name in ("html-report.png", "trace-view.png"):
        print(f"wrote docs/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
