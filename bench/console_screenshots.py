"""The screenshots of docs/console.md, from a real run: `agent-server run` with the console
tests' app (tests/apps/console_app.py) and a tokens file, a few executions (one waiting for
input, one held running, one handed a result), and what Debian's chromium shows of the
executions list, an execution waiting for input, and the replicas view.

    PYTHONPATH=. python bench/console_screenshots.py docs/console
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.support.browser import chromium
from tests.support.process import ServerProcess

TOKEN = "tok-screenshots-0a1b2c3d4e5f60718293a4b5c6d7e8f9"
WAIT = 20.0


def wait_for(driver: object, selector: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, WAIT).until(ec.presence_of_element_located((By.CSS_SELECTOR, selector)))


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="console-shots-"))
    tokens = work / "tokens"
    tokens.write_text(f"{TOKEN} operator ops admin\n")
    server = ServerProcess(
        ["console_app:agent", "--api-tokens-file", str(tokens), "--replica-id", "pod-a"],
        {},
        work,
    )
    try:
        server.wait_ready()
        with httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
        ) as client:
            for text in ("hello", "from the console"):
                client.post("/reasoners/echo/async", json={"text": text})
            client.post("/reasoners/explode/async", json={"text": "no such order"})
            client.post("/reasoners/hold/async", json={})
            asked = client.post("/reasoners/order/async", json={}).json()
            time.sleep(0.5)  # the ask recorded; a screenshot, not a test: nothing is asserted
        with chromium("1280,1100") as driver:
            driver.get(f"{server.url}/console")
            wait_for(driver, "#token")
            driver.find_element("id", "token").send_keys(TOKEN)
            driver.find_element("id", "token-submit").click()
            wait_for(driver, "#executions-rows tr")
            time.sleep(0.5)
            driver.save_screenshot(str(out / "executions.png"))
            driver.get(f"{server.url}/console#/executions/{asked['execution_id']}")
            wait_for(driver, "form.answer")
            driver.save_screenshot(str(out / "execution.png"))
            driver.get(f"{server.url}/console#/replicas")
            wait_for(driver, "#replica-rows tr")
            driver.save_screenshot(str(out / "replicas.png"))
    finally:
        server.close()
    print(f"screenshots in {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/console"))
