"""`GET /docs` in a real browser: Debian's chromium, headless, driven by selenium through
Debian's chromedriver (`.ci/run` installs both). The page loads with no console error and
no request leaving loopback, lists the reasoners' operations, and "Try it out" on `echo`
returns its execution; with a token, the page asks for it and "Authorize" carries it.
`--no-docs` turns the page off."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.support.browser import (
    WAIT,
    chromium,
    console_errors,
    leaving_loopback,
    requested_urls,
)
from tests.support.process import ServerProcess

Start = Callable[..., ServerProcess]


@pytest.fixture
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


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
