"""`GET /docs` in a real browser: Debian's chromium, headless, driven by selenium through
Debian's chromedriver (`.ci/run` installs both). The page loads with no console error and
no request leaving loopback, lists the reasoners' operations, and "Try it out" on `echo`
returns its execution; with a token, the page asks for it and "Authorize" carries it.
`--no-docs` turns the page off."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.process import ServerProcess, need

WAIT = 20.0
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
Start = Callable[..., ServerProcess]


@pytest.fixture
def browser() -> Iterator[Any]:
    chromium = need("chromium", package="chromium")
    chromedriver = need("chromedriver", package="chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="docs-page-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    # Both paths given, so selenium never looks for (or downloads) a driver of its own.
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    driver.set_page_load_timeout(WAIT)
    driver.get_log("performance")  # what the browser did at its start (its new-tab page)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def requested_urls(driver: Any) -> list[str]:
    """Every URL the page asked the network for (CDP Network.requestWillBeSent)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def leaving_loopback(urls: list[str]) -> list[str]:
    """The URLs that would go over a network beyond this machine's loopback (the browser's
    own `chrome:`, `data:` and `blob:` URLs go nowhere)."""
    return [
        url
        for url in urls
        if urlsplit(url).scheme not in ("chrome", "data", "blob", "about")
        and urlsplit(url).hostname not in ("127.0.0.1", "localhost", "::1")
    ]


def console_errors(driver: Any) -> list[dict[str, Any]]:
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def wait_until(driver: Any, condition: Callable[[Any], Any]) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT).until(condition)


def css(driver: Any, selector: str) -> Any:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    return wait_until(driver, ec.element_to_be_clickable((By.CSS_SELECTOR, selector)))


def try_echo(driver: Any, text: str) -> dict[str, Any]:
    """Open `POST /reasoners/echo`, Try it out, send `{"text": ...}`, read the answer."""
    from selenium.webdriver.common.by import By

    css(driver, "#operations-echo-run_echo .opblock-summary-control").click()
    css(driver, "#operations-echo-run_echo .try-out__btn").click()
    body = css(driver, "#operations-echo-run_echo textarea.body-param__text")
    body.clear()
    body.send_keys(json.dumps({"text": text}))
    css(driver, "#operations-echo-run_echo .execute").click()
    code = wait_until(
        driver,
        lambda d: d.find_element(
            By.CSS_SELECTOR,
            "#operations-echo-run_echo .live-responses-table tr.response .response-col_status",
        ),
    )
    status = code.text.strip()
    answer = driver.find_element(
        By.CSS_SELECTOR,
        "#operations-echo-run_echo .live-responses-table tr.response .highlight-code .microlight",
    ).text
    return {"status": status, "body": json.loads(answer)}


def test_the_page_lists_the_reasoners_and_runs_echo(server_factory: Start, browser: Any) -> None:
    server = server_factory("tests_app:agent")
    browser.get(f"{server.url}/docs")
    css(browser, "#operations-echo-run_echo")
    operations = {
        element.get_attribute("id")
        for element in browser.find_elements("css selector", ".opblock[id^=operations-]")
    }
    assert {"operations-echo-run_echo", "operations-echo-start_echo"} <= operations
    assert "operations-fail-run_fail" in operations

    answer = try_echo(browser, "from the browser")
    assert answer["status"] == "200"
    assert answer["body"]["status"] == "succeeded"
    assert answer["body"]["result"] == {"text": "from the browser"}

    assert console_errors(browser) == []
    urls = requested_urls(browser)
    assert f"{server.url}/openapi.json" in urls
    assert f"{server.url}/docs/swagger-ui-bundle.js" in urls
    assert leaving_loopback(urls) == []


def test_with_a_token_the_page_asks_for_it_and_authorizes(
    server_factory: Start, browser: Any
) -> None:
    server = server_factory("tests_app:agent", "--api-token", "page-token")
    assert httpx.get(f"{server.url}/openapi.json", timeout=5).status_code == 401
    browser.get(f"{server.url}/docs")
    field = css(browser, "#token")
    field.send_keys("page-token")
    css(browser, "#token-submit").click()
    css(browser, "#operations-echo-run_echo")
    # Swagger UI's own Authorize dialog shows the bearer scheme as authorized.
    css(browser, ".auth-wrapper .authorize").click()
    dialog = css(browser, ".auth-container")
    assert "Authorized" in dialog.text
    css(browser, ".auth-btn-wrapper .btn-done").click()
    answer = try_echo(browser, "with a token")
    assert answer["status"] == "200"
    assert answer["body"]["result"] == {"text": "with a token"}
    assert console_errors(browser) == []


def test_no_docs_is_404(server_factory: Start) -> None:
    off = server_factory("tests_app:agent", "--no-docs")
    assert httpx.get(f"{off.url}/docs", timeout=5).status_code == 404
    assert httpx.get(f"{off.url}/docs/swagger-ui-bundle.js", timeout=5).status_code == 404
    on = server_factory("tests_app:agent")
    page = httpx.get(f"{on.url}/docs", timeout=5)
    assert page.status_code == 200
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert httpx.post(f"{on.url}/docs", timeout=5).status_code == 405
