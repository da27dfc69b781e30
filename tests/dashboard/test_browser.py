"""The dashboard in a real browser, on a live search: Debian's headless Chromium driven by selenium.

Why selenium: it drives the ChromeDriver that Debian builds with its Chromium (same
version by construction, from the packages ``./dev test`` installs), from Python and
pytest like every other test here, with nothing downloaded at run time; playwright
would need Node modules or its own browser build beside the system one.

The test opens the page on an empty directory, starts a search there (the fake
evaluator, slowed down so that the run lasts several seconds), and watches the page
update itself without a reload: the evaluation count climbs, the best-so-far rises
to the journal's best. Then it opens a node of the best candidate's lineage and
reads its diff, and tears the journal to see the page say so. Screenshots land in
the test's ``tmp_path``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evokernel.journal import RunDir

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
FAKE = str(REPO / "tests" / "fake_run.yaml")
CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1400,1800"]


def find_chromium() -> tuple[str, str]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium and driver:
        return chromium, driver
    if os.environ.get("CI"):
        pytest.fail("chromium or chromedriver is missing: ./dev test installs Debian's chromium and chromium-driver")
    pytest.skip("needs Debian's chromium and chromium-driver (./dev test installs them)")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    chromium, driver_path = find_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def start_dashboard(path: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "evokernel.dashboard", str(path), "--port", "0", "--poll", "0.25"],
                            cwd=REPO, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    if "http://127.0.0.1:" not in line:
        proc.kill()
        pytest.fail(f"the dashboard did not start: {line}{proc.stderr.read()}")
    return proc, line.split()[1]


def wait_for(condition: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def text(driver: Any, element_id: str) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.ID, element_id).text)


def test_live_search_best_so_far_updates_and_a_node_diff_opens(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    run = tmp_path / "run"
    run.mkdir()
    dashboard, url = start_dashboard(run)
    search = None
    try:
        browser.get(url)
        wait_for(lambda: "waiting" in text(browser, "notices"), 20, "the page to say it waits for the run")
        browser.execute_script("window.notReloaded = true;")
        search = subprocess.Popen(
            [sys.executable, "-m", "evokernel.search", "--config", FAKE, "--run-dir", str(run), "--budget", "32",
             "--set", "evaluator.options.delay_s=0.3", "--quiet"],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        seen: list[tuple[int, str]] = []
        shot_mid = False
        while search.poll() is None:
            if browser.find_element(By.ID, "run").is_displayed():
                count = text(browser, "stat-evaluations")
                if count.isdigit() and (not seen or seen[-1] != (int(count), text(browser, "stat-best"))):
                    seen.append((int(count), text(browser, "stat-best")))
                if not shot_mid and len(seen) > 3:
                    browser.save_screenshot(str(tmp_path / "live-mid-run.png"))
                    shot_mid = True
            time.sleep(0.2)
        assert search.returncode == 0, search.stderr.read() if search.stderr else ""
        records = RunDir.open(run).records()
        best = max(r.evaluation.fitness for r in records if r.evaluation.fitness is not None)
        wait_for(lambda: text(browser, "stat-evaluations") == str(len(records)), 20, "the final count")
        assert text(browser, "stat-best") == f"{best:.4g}" or float(text(browser, "stat-best")) == pytest.approx(best, rel=1e-3)
        assert browser.execute_script("return window.notReloaded === true;"), "the page reloaded itself"
        counts = [c for c, _ in seen]
        assert counts == sorted(counts) and len(set(counts)) >= 3, f"the page did not follow the run: {seen}"
        bests = [float(b) for _, b in seen if b.replace(".", "", 1).isdigit()]
        assert bests and min(bests) < best, f"best-so-far never rose in the page: {seen}"
        trace = browser.execute_script("return document.getElementById('chart-evals').data[1].y;")
        assert len(trace) == len(records) and trace[-1] == pytest.approx(best)
        # the finalists the search measured again after its budget, with the one it named
        finals = json.loads((run / "finalists.json").read_text())
        wait_for(lambda: browser.find_element(By.ID, "finalists-section").is_displayed(), 20, "the finalists")
        rows = browser.find_elements(By.CSS_SELECTOR, "#finalists tbody tr")
        assert len(rows) == len(finals["finalists"]) and f"Best found: {finals['best']}" in text(browser, "finalists-note")
        browser.save_screenshot(str(tmp_path / "run-finished.png"))

        # open the best candidate's node from the lineage table and read its diff
        row = browser.find_element(By.CSS_SELECTOR, "#lineage tbody tr[data-id]")
        best_id = row.get_attribute("data-id")
        row.click()
        diff = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#node .diff-text"), 20, "the node's diff")
        parent = next(r for r in records if r.candidate_id == best_id).candidate["parents"][0]
        diff_text = diff[0].text
        assert f"--- {parent}/" in diff_text and f"+++ {best_id}/" in diff_text
        changed = [ln for ln in diff_text.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
        assert changed, diff_text
        assert best_id in text(browser, "node") and "PASSED" in text(browser, "node")
        browser.save_screenshot(str(tmp_path / "node-diff.png"))

        # a torn journal: the page says so, with no server error
        with open(run / "journal.jsonl", "ab") as f:
            f.write(b'{"seq": 99, "gen": 9, "candid')
        wait_for(lambda: "partly written line" in text(browser, "notices"), 20, "the torn-journal notice")
        assert not browser.find_element(By.ID, "error").is_displayed()
        assert text(browser, "stat-evaluations") == str(len(records))
        browser.save_screenshot(str(tmp_path / "torn-journal.png"))
    finally:
        if search is not None and search.poll() is None:
            search.kill()
        dashboard.terminate()
        dashboard.wait(timeout=10)
    assert (tmp_path / "live-mid-run.png").stat().st_size > 10_000
