"""Take the README's dashboard screenshot: a fake search with LLM operators, shown in Chromium.

    python scripts/dashboard_screenshot.py [--out docs/dashboard.png]

Runs a 40-evaluation search over the fake workload (evokernel/testing.py) with the
scripted LLM on loopback and the knob operators, starts ``python -m
evokernel.dashboard`` on it, opens the page in Debian's headless Chromium (selenium
with the system chromedriver), opens the best candidate's node and saves the page.
Nothing is measured: the numbers are the fake landscape's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,1500", "--hide-scrollbars"]


def search(run: Path) -> None:
    from evokernel.llm.stub import StubLLMServer
    from evokernel.testing import fake_llm_responder

    rates = "operators.rates={llm_mutate: 2, llm_mutate_diff: 1, llm_repair: 1, knob_mutation: 2}"
    with StubLLMServer(responder=fake_llm_responder) as stub:
        env = {**os.environ, "PYTHONPATH": str(REPO), "EVOKERNEL_LLM_BASE_URL": stub.base_url,
               "EVOKERNEL_LLM_MODEL": "stub-model"}
        subprocess.run([sys.executable, "-m", "evokernel.search", "--quiet", "--config", "tests/fake_run.yaml",
                        "--operators", "mixed", "--budget", "40", "--run-dir", str(run), "--set", rates,
                        "--set", "evolutionary.tune_trials=3", "--set", "llm.max_retries=0"],
                       cwd=REPO, env=env, check=True, capture_output=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(REPO / "docs" / "dashboard.png"))
    args = p.parse_args()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "dsa-demo-run"
        search(run)
        server = subprocess.Popen([sys.executable, "-m", "evokernel.dashboard", str(run), "--port", "0"],
                                  cwd=REPO, stderr=subprocess.PIPE, text=True)
        try:
            assert server.stderr is not None
            url = server.stderr.readline().split()[1]
            options = webdriver.ChromeOptions()
            options.binary_location = "/usr/bin/chromium"
            for flag in [*FLAGS, f"--user-data-dir={tmp}/profile"]:
                options.add_argument(flag)
            driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
            try:
                driver.get(url)
                time.sleep(3)
                driver.find_element(By.CSS_SELECTOR, "#lineage tbody tr[data-id]").click()
                time.sleep(1.5)
                driver.execute_script("document.querySelector('#node').scrollIntoView({block: 'end'});"
                                      "window.scrollTo(0, 0);")
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                driver.save_screenshot(args.out)
            finally:
                driver.quit()
        finally:
            server.terminate()
            server.wait(timeout=10)
    print(f"screenshot: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
