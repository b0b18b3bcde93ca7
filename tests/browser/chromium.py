"""Headless Chromium (Debian's chromium + chromium-driver) through Selenium: the browser
tests and scripts/screenshots.py share it. Nothing here fetches a browser or a driver:
without Debian's two packages, `missing()` says so and the tests skip."""
from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
# scripts/setup.sh installs speedscope (npm) here: an offline viewer of trace-event JSON.
SPEEDSCOPE = ROOT / "build" / "speedscope" / "node_modules" / "speedscope" / "dist" / "release" / "index.html"


def _which(*names: str) -> Optional[str]:
    return next((p for p in map(shutil.which, names) if p), None)


def missing() -> Optional[str]:
    """Why no browser test can run here, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    if not _which("chromium", "chromium-browser"):
        return "no chromium (apt-get install chromium chromium-driver: scripts/setup.sh does)"
    if not _which("chromedriver"):
        return "no chromedriver (apt-get install chromium-driver: scripts/setup.sh does)"
    return None


def start(width: int = 1400, height: int = 900):
    """A headless Chromium that logs the console and the network requests."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = _which("chromium", "chromium-browser")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--hide-scrollbars", f"--window-size={width},{height}", "--force-device-scale-factor=1",
                # speedscope reads the profile from a local .js file next to it
                "--allow-file-access-from-files", "--enable-unsafe-swiftshader"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(_which("chromedriver")), options=options)
    driver.set_page_load_timeout(60)
    return driver


def console_errors(driver) -> list[str]:
    """Console errors and uncaught exceptions (Chromium logs both as SEVERE)."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def requested_urls(driver) -> list[str]:
    """Every URL the page asked the network stack for, from the DevTools performance log."""
    urls = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            urls.append(msg["params"]["request"]["url"])
    return urls


def full_page_png(driver, path: str) -> None:
    """A screenshot of the whole page, not only the window (DevTools' captureBeyondViewport)."""
    metrics = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})
    size = metrics.get("cssContentSize") or metrics["contentSize"]
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}})
    Path(path).write_bytes(base64.b64decode(shot["data"]))


def ink_fraction(path: str, background=(255, 255, 255), tolerance: int = 16) -> float:
    """Share of pixels that differ from the background: a blank page gives ~0."""
    from PIL import Image, ImageChops
    img = Image.open(path).convert("RGB")
    diff = ImageChops.difference(img, Image.new("RGB", img.size, background))
    r, g, b = diff.split()
    far = sum(ImageChops.lighter(ImageChops.lighter(r, g), b).histogram()[tolerance + 1:])
    return far / (img.width * img.height)


def color_fraction(path: str, spread: int = 40) -> float:
    """Share of coloured pixels (channels apart by more than `spread`): a viewer's grey
    chrome and text give ~0, its drawn slices do not."""
    from PIL import Image, ImageChops
    r, g, b = Image.open(path).convert("RGB").split()
    high = ImageChops.lighter(ImageChops.lighter(r, g), b)
    low = ImageChops.darker(ImageChops.darker(r, g), b)
    hist = ImageChops.subtract(high, low).histogram()
    return sum(hist[spread + 1:]) / (r.width * r.height)


def speedscope_page(trace_json: str, js_path: str) -> str:
    """speedscope's URL for a trace file: the profile goes in a .js file beside it, as its CLI does."""
    data = base64.b64encode(Path(trace_json).read_bytes()).decode()
    Path(js_path).write_text(f"speedscope.loadFileFromBase64({json.dumps(os.path.basename(trace_json))}, "
                             f"{json.dumps(data)})")
    return f"{SPEEDSCOPE.as_uri()}#localProfilePath={os.path.abspath(js_path)}"
