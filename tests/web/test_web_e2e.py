"""End to end, as a user: the page in headless Chromium (Debian's chromium + chromium-driver, via Selenium)
against a real server on a free localhost port. Change a knob; the displayed peak follows the API; an error
leaves no number or verdict of other inputs on screen; the timeline of a vision model draws (no JS exception).

CI needs: apt-get install -y chromium chromium-driver (see README). Skips cleanly without them.
"""
from __future__ import annotations

import os
import shutil
import socket
import threading
import time

import pytest

CHROMIUM = "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is absent: apt-get install -y chromium chromium-driver"),
    pytest.mark.skipif(not os.path.exists(DRIVER), reason="chromedriver is absent: apt-get install -y chromium-driver"),
]

selenium = pytest.importorskip("selenium")
pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.select import Select  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402

from trainfit import api  # noqa: E402
from trainfit.report.held import fit_numbers, verdict_word  # noqa: E402
from trainfit.setup import BY_NAME, choices_for  # noqa: E402
from trainfit.units import fmt_bytes  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    import uvicorn

    from trainfit.web.app import create_app

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail("the trainfit server did not start")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, for uncaught exceptions
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1280,1000",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=DRIVER))
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def peak_bytes(driver) -> int:
    v = driver.find_element(By.ID, "peak").get_attribute("data-bytes")
    return int(v) if v else -1


def set_number(driver, element_id: str, value: int) -> None:
    box = driver.find_element(By.ID, element_id)
    box.clear()  # fires input: the page may briefly show an error for the empty box
    box.send_keys(str(value))


def text(driver, element_id: str) -> str:
    return driver.find_element(By.ID, element_id).text


def fresh(driver) -> bool:
    """The result on screen is the answer for the inputs on screen (no request pending or scheduled)."""
    return driver.execute_script('return document.getElementById("result").dataset.stale === undefined '
                                 '&& document.getElementById("status").textContent === ""')


def load(driver, server: str) -> WebDriverWait:
    driver.get(server + "/")
    # the page replaces the result's elements as each answer arrives: a wait that reads one between its lookup and its
    # attribute gets a stale reference, and tries again (WebDriverWait ignores only NoSuchElementException by default)
    wait = WebDriverWait(driver, 20, ignored_exceptions=(StaleElementReferenceException,))
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
    driver.get_log("browser")  # drop what an earlier page logged
    return wait


def js_errors(driver) -> list[str]:
    """Uncaught exceptions and rejections in the console (a 400 answer's 'Failed to load resource' is expected)."""
    return [e["message"] for e in driver.get_log("browser")
            if e["level"] == "SEVERE" and "Failed to load resource" not in e["message"]]


def assert_blank(driver) -> None:
    """No number, verdict or chart of earlier inputs beside an error."""
    assert peak_bytes(driver) == -1 and text(driver, "peak") == "–"
    assert text(driver, "verdict") == "–" and text(driver, "params") == "–" and text(driver, "headroom") == ""
    assert driver.find_element(By.ID, "device-total").get_attribute("data-bytes") == ""
    assert text(driver, "rows") == "" and text(driver, "chart") == "" and "fits" not in text(driver, "result")


def test_changing_batch_updates_the_peak(server, browser):
    wait = load(browser, server)
    model = browser.find_element(By.ID, "model").get_attribute("value")
    gpu = browser.find_element(By.ID, "gpu").get_attribute("value")
    base = dict(model=model, gpu=gpu or None, precision="amp-bf16")
    before = peak_bytes(browser)
    assert before == api.analytic(api.Request(batch=1, **base)).memory.peak
    assert browser.find_element(By.ID, "peak").text == fmt_bytes(before)

    set_number(browser, "batch", 8)
    expected = api.analytic(api.Request(batch=8, **base)).memory.peak
    wait.until(lambda d: peak_bytes(d) == expected)
    assert expected > before
    assert browser.find_element(By.ID, "peak").text == fmt_bytes(expected)
    verdict = browser.find_element(By.ID, "verdict").text
    e8 = api.analytic(api.Request(batch=8, **base))
    assert verdict == ("fits" if e8.time.fits else "does not fit")
    # what the GPU holds: the API's reserved and device total, the reports' sentence; beside the verdict the numbers
    # it reads (the fit rule's required of capacity)
    held = {i: browser.find_element(By.ID, i).get_attribute("data-bytes") for i in ("reserved", "device-total")}
    assert held == {"reserved": str(e8.memory.reserved), "device-total": str(e8.memory.device_total)}
    assert fit_numbers(e8.fit) in browser.find_element(By.ID, "headroom").text
    assert "what nvidia-smi shows" in browser.find_element(By.ID, "held-note").text
    assert not browser.find_element(By.ID, "error").is_displayed()

    # a bad knob: a clear message on the page, and none of the numbers it replaced
    set_number(browser, "tp", 3)
    wait.until(lambda d: d.find_element(By.ID, "error").is_displayed()
               and "does not divide" in d.find_element(By.ID, "error").text and fresh(d))
    assert_blank(browser)
    set_number(browser, "tp", 1)
    wait.until(lambda d: not d.find_element(By.ID, "error").is_displayed() and fresh(d))
    assert peak_bytes(browser) == expected

    # switching to inference lowers the peak, to exactly the API's number
    Select(browser.find_element(By.ID, "mode")).select_by_value("infer")
    infer = api.analytic(api.Request(model=model, gpu=gpu or None, batch=8, mode="infer", precision="bf16")).memory.peak
    wait.until(lambda d: peak_bytes(d) == infer)
    assert infer < expected


@pytest.mark.heavy  # ~5 s in a browser: the other end-to-end checks stay in the default run
def test_a_mode_switch_and_an_error_leave_nothing_stale(server, browser):
    """train -> serve -> infer -> an invalid batch -> a valid one: each screen is the answer for its inputs."""
    wait = load(browser, server)
    model = browser.find_element(By.ID, "model").get_attribute("value")
    gpu = browser.find_element(By.ID, "gpu").get_attribute("value")
    train = api.analytic(api.Request(model=model, gpu=gpu))
    assert peak_bytes(browser) == train.memory.peak and text(browser, "verdict") in ("fits", "does not fit")

    Select(browser.find_element(By.ID, "mode")).select_by_value("serve")
    assert browser.find_element(By.ID, "result").get_attribute("data-stale") == "1"  # at once, before the answer
    serve = api.analytic(api.Request(model=model, gpu=gpu, mode="serve"))
    wait.until(lambda d: fresh(d) and peak_bytes(d) == serve.memory.peak)
    assert text(browser, "verdict") == verdict_word(serve.time, "serve")
    assert not browser.find_element(By.ID, "batch").is_enabled()  # serving has no --batch: not sent, not editable
    assert browser.find_element(By.ID, "server").is_enabled()
    precisions = [o.get_attribute("value") for o in Select(browser.find_element(By.ID, "precision")).options]
    assert precisions == ["", *choices_for(BY_NAME["precision"], "serve")]

    Select(browser.find_element(By.ID, "mode")).select_by_value("infer")
    wait.until(lambda d: fresh(d) and peak_bytes(d) == api.analytic(
        api.Request(model=model, gpu=gpu, mode="infer")).memory.peak)
    set_number(browser, "batch", 0)
    wait.until(lambda d: fresh(d) and "--batch" in text(d, "error"))
    assert_blank(browser)

    set_number(browser, "batch", 4)
    infer = api.analytic(api.Request(model=model, gpu=gpu, mode="infer", batch=4))
    wait.until(lambda d: fresh(d) and not d.find_element(By.ID, "error").is_displayed())
    assert peak_bytes(browser) == infer.memory.peak and text(browser, "peak") == fmt_bytes(infer.memory.peak)
    assert text(browser, "verdict") == ("fits" if infer.time.fits else "does not fit")
    assert browser.find_element(By.ID, "device-total").get_attribute("data-bytes") == str(infer.memory.device_total)

    # a late answer to older inputs never lands: the next /api/view answer is held back 1.5 s (past the abort)
    browser.execute_script("""const real = window.fetch; let held = true;
      window.fetch = (url, opts) => {
        if (!(held && String(url).startsWith("/api/view"))) return real(url, opts);
        held = false;
        return new Promise(ok => setTimeout(() => ok(real(url, {...opts, signal: undefined})), 1500));
      };""")
    set_number(browser, "batch", 2)
    time.sleep(0.5)  # past the page's 120 ms debounce: batch 2 is asked (and held back), then batch 3
    set_number(browser, "batch", 3)
    b3 = api.analytic(api.Request(model=model, gpu=gpu, mode="infer", batch=3)).memory.peak
    wait.until(lambda d: fresh(d) and peak_bytes(d) == b3)
    time.sleep(1.5)  # the held-back answer for batch 2 has arrived by now
    assert peak_bytes(browser) == b3 and fresh(browser)
    assert js_errors(browser) == []


def test_the_timeline_of_a_vision_model(server, browser):
    """The trace button draws a vision model's step (it once raised a raw SyntaxError on the server's 500)."""
    wait = load(browser, server)
    Select(browser.find_element(By.ID, "model")).select_by_value("tiny-resnet")
    wait.until(lambda d: fresh(d) and peak_bytes(d) == api.analytic(
        api.Request(model="tiny-resnet", gpu=d.find_element(By.ID, "gpu").get_attribute("value"))).memory.peak)
    browser.find_element(By.ID, "trace-btn").click()
    WebDriverWait(browser, 120).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, "#timeline svg, #timeline-error"))
    assert browser.find_elements(By.CSS_SELECTOR, "#timeline svg"), text(browser, "timeline")
    assert js_errors(browser) == []

    Select(browser.find_element(By.ID, "mode")).select_by_value("infer")  # a vision model trains only: one line
    assert text(browser, "timeline") == ""  # the timeline of other inputs is dropped at once
    wait.until(lambda d: fresh(d) and "--mode infer" in text(d, "error"))
    assert_blank(browser)
    browser.find_element(By.ID, "trace-btn").click()
    wait.until(lambda d: d.find_elements(By.ID, "timeline-error"))
    assert "--mode infer" in text(browser, "timeline-error") and "\n" not in text(browser, "timeline-error")
    assert js_errors(browser) == []
