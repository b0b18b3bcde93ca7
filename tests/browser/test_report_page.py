"""`otel-gpu report --html` in a real headless Chromium: the page loads with no console
error and no network request, shows the routes and the waterfall's kernels and
attributions, and its screenshot is a full, non-blank picture."""
import subprocess
import sys

from tests.browser import chromium

KERNELS = ("matmul_tile", "layernorm_kernel", "softmax_kernel", "embedding_gather")


def _write_page(db, path, *extra):
    subprocess.run([sys.executable, "-m", "otel_gpu.cli", "report", "--db", db, "--html", str(path), *extra],
                   check=True, capture_output=True, timeout=60)


def test_report_page_in_chromium(browser, demo, tmp_path):
    db, info = demo
    page = tmp_path / "report.html"
    _write_page(db, page)
    browser.get_log("browser"), browser.get_log("performance")  # start from empty logs
    browser.get(page.as_uri())
    plots = browser.execute_script(
        "return Array.from(document.querySelectorAll('.js-plotly-plot')).map(d => [d.id, d.textContent])")
    text = dict(plots)
    assert sorted(text) == ["over-time", "per-route", "waterfall"]  # each drew its SVG
    assert chromium.console_errors(browser) == []
    assert [u for u in chromium.requested_urls(browser) if not u.startswith(("file:", "data:"))] == []
    for route in ("demo-inference /infer/{id}", "demo-async /v1/generate", "demo-inference /embed"):
        assert route in text["over-time"] and route in text["per-route"]
    assert "demo-inference (outside)" in text["over-time"]
    for kernel in KERNELS:
        assert kernel in text["waterfall"]
    for attribution in ("request", "thread", "process", "ambiguous", "window"):
        assert attribution in text["waterfall"]  # the legend names each outcome drawn
    assert "128x128x1 / 16x16x1" in text["waterfall"] and "h2d 4.0M" in text["waterfall"]
    slowest = browser.execute_script("return document.querySelector('#slowest tr.shown').textContent")
    assert info["slowest"]["trace_id"] in slowest
    shot = tmp_path / "report.png"
    chromium.full_page_png(browser, str(shot))
    from PIL import Image
    width, height = Image.open(shot).size
    page_h = browser.execute_script("return document.documentElement.scrollHeight")
    assert width == 1400 and abs(height - page_h) <= 1 and height > 1500
    assert chromium.ink_fraction(str(shot)) > 0.15  # charts drawn, not a white page


def test_chromium_reports_a_broken_page(browser, tmp_path):
    """The error collection above would see a script error: a page that throws one."""
    page = tmp_path / "broken.html"
    page.write_text("<html><body><script>undefined_function_of_the_test()</script></body></html>")
    browser.get_log("browser")
    browser.get(page.as_uri())
    assert any("undefined_function_of_the_test" in e for e in chromium.console_errors(browser))
