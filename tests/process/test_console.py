"""`/console` in a real browser: Debian's chromium, headless, driven by selenium through
Debian's chromedriver (as tests/process/test_docs_page.py drives `/docs`), against a real
`agent-server run` with a tokens file of two tenants and an admin.

The invariants: the page loads without a token and asks for one, keeps it for the tab only
(sessionStorage: never localStorage, a cookie or a URL) and sends it as a bearer header, so
it shows and does exactly what the API lets that token (a tenant sees its own, the admin
all); the list shows new executions and status changes without a reload; an execution's
page draws its attempts, answers a request through the form its schema makes (typed values
reach the reasoner), cancels, and runs again with the input the server kept; every value
(input, prompt, result, error, event) is shown as text, so markup in it runs nothing; the
replicas view shows the replica, its in-flight count and its drain; no request leaves
loopback, the token reaches no URL and no log line; a strict CSP is sent; `--no-console` is
a 404.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
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
from tests.support.process import ServerProcess, need

APP = "console_app:agent"
ALICE = "tok-console-alice-5b1c9e0a7d3f4e62a8b9c0d1e2f3a4b5"  # tenant acme
BOB = "tok-console-bob-0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b"  # tenant globex
ROOT = "tok-console-root-1f2e3d4c5b6a79808f7e6d5c4b3a2918"  # tenant ops, admin
MARKUP = '<img src=x onerror="window.__injected=1"><script>window.__injected=2</script>'
Start = Callable[..., ServerProcess]
Events = '#events li[data-event="progress"]'


@pytest.fixture
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


def serve(server_factory: Start, tmp_path: Path, *args: str) -> ServerProcess:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{ALICE} alice acme\n{BOB} bob globex\n{ROOT} root ops admin\n")
    return server_factory(APP, "--api-tokens-file", str(tokens), *args)


def api(server: ServerProcess, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=10
    )


def start(server: ServerProcess, token: str, reasoner: str, body: Any) -> dict[str, Any]:
    with api(server, token) as client:
        answer = client.post(f"/reasoners/{reasoner}/async", json=body)
    assert answer.status_code == 202, answer.text
    return dict(answer.json())


def wait_until(driver: Any, condition: Callable[[Any], Any], timeout: float = WAIT) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(condition)


def css(driver: Any, selector: str) -> Any:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    return wait_until(driver, ec.presence_of_element_located((By.CSS_SELECTOR, selector)))


def text_of(driver: Any, selector: str) -> str:
    """The text of the first element `selector` finds, "" for none: read in the page, so a
    view that redraws between finding and reading is no stale reference."""
    found = driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent : ''",
        selector,
    )
    return str(found).strip()


def open_console(driver: Any, server: ServerProcess, token: str, view: str = "") -> None:
    """The page, its token prompt answered (typed, then Enter), at `view` (a hash)."""
    from selenium.webdriver.common.keys import Keys

    driver.get(f"{server.url}/console{view}")
    field = css(driver, "#token")
    label = driver.find_element("css selector", "label[for=token]")
    assert "token" in label.text.lower()
    field.send_keys(token, Keys.ENTER)
    wait_until(driver, lambda d: d.find_element("id", "token-form").get_attribute("hidden"))


def row_status(driver: Any, execution_id: str) -> str:
    return text_of(driver, f'#executions-rows tr[data-id="{execution_id}"] td:nth-child(3)')


def page_status(driver: Any) -> str:
    return text_of(driver, "#record-status")


def nothing_injected(driver: Any) -> None:
    assert driver.execute_script("return window.__injected === undefined")
    assert driver.find_elements("css selector", "main img, main script") == []


def test_the_page_asks_a_token_lists_live_and_keeps_tenants_apart(
    server_factory: Start, tmp_path: Path, browser: Any
) -> None:
    server = serve(server_factory, tmp_path)
    page = httpx.get(f"{server.url}/console", timeout=5)
    assert page.status_code == 200
    policy = page.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert "<script>" not in page.text and "style=" not in page.text  # nothing inline
    script = httpx.get(f"{server.url}/console/console.js", timeout=5)
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert httpx.get(f"{server.url}/executions", timeout=5).status_code == 401

    theirs = start(server, BOB, "echo", {"text": "globex's"})
    first = start(server, ALICE, "echo", {"text": "acme's"})
    open_console(browser, server, ALICE)
    wait_until(browser, lambda d: row_status(d, first["execution_id"]) == "succeeded")
    link = browser.find_element(
        "css selector", f'#executions-rows tr[data-id="{first["execution_id"]}"] a'
    )
    assert first["execution_id"][:8] in link.text
    # Started through the API while the page is open: it appears, then succeeds, no reload.
    short = start(server, ALICE, "hold", {"seconds": 3})
    wait_until(browser, lambda d: row_status(d, short["execution_id"]) == "running")
    wait_until(browser, lambda d: row_status(d, short["execution_id"]) == "succeeded")
    held = start(server, ALICE, "hold", {})
    wait_until(browser, lambda d: row_status(d, held["execution_id"]) in ("running", "queued"))
    with api(server, ALICE) as client:
        assert client.post(f"/executions/{held['execution_id']}/cancel").status_code in (200, 202)
    wait_until(browser, lambda d: row_status(d, held["execution_id"]) == "cancelled")
    # A tenant's list holds its own only.
    ids = [r.get_attribute("data-id") for r in browser.find_elements("css selector", "tr[data-id]")]
    assert set(ids) == {first["execution_id"], short["execution_id"], held["execution_id"]}
    assert theirs["execution_id"] not in browser.page_source

    # Kept for the tab only: a reload keeps the token and the view, nothing else holds it.
    assert browser.execute_script("return localStorage.length") == 0
    assert browser.get_cookies() == []
    browser.refresh()
    wait_until(browser, lambda d: row_status(d, first["execution_id"]) == "succeeded")
    assert browser.find_element("id", "token-form").get_attribute("hidden") is not None
    # The filters: by status, by reasoner.
    browser.get(f"{server.url}/console#/executions?status=cancelled")
    wait_until(browser, lambda d: row_status(d, held["execution_id"]) == "cancelled")
    assert row_status(browser, first["execution_id"]) == ""

    urls = requested_urls(browser)
    assert f"{server.url}/executions?status=cancelled&limit=50" in urls
    assert leaving_loopback(urls) == []
    assert not [url for url in urls if ALICE in url]
    assert console_errors(browser) == []
    assert ALICE not in server.stderr()

    # The admin's list holds every tenant's.
    browser.execute_script("sessionStorage.clear()")
    open_console(browser, server, ROOT)
    wait_until(browser, lambda d: row_status(d, theirs["execution_id"]) == "succeeded")


def test_the_keyboard_reaches_the_views_and_the_filters(
    server_factory: Start, tmp_path: Path, browser: Any
) -> None:
    from selenium.webdriver.common.keys import Keys

    server = serve(server_factory, tmp_path)
    echoed = start(server, ALICE, "echo", {"text": "kept"})
    held = start(server, ALICE, "hold", {})
    open_console(browser, server, ALICE)
    wait_until(browser, lambda d: row_status(d, echoed["execution_id"]) == "succeeded")

    def tab_to(text: str) -> Any:
        for _ in range(40):
            focused = browser.switch_to.active_element
            if focused.text == text or focused.get_attribute("id") == text:
                return focused
            focused.send_keys(Keys.TAB)
        raise AssertionError(f"{text!r} is not reached with Tab")

    browser.find_element("tag name", "body").send_keys(Keys.TAB)
    tab_to("filter-reasoner").send_keys("echo", Keys.ENTER)
    wait_until(browser, lambda d: "reasoner=echo" in d.execute_script("return location.hash"))
    wait_until(browser, lambda d: row_status(d, held["execution_id"]) == "")
    assert row_status(browser, echoed["execution_id"]) == "succeeded"
    tab_to(echoed["execution_id"][:8]).send_keys(Keys.ENTER)
    wait_until(browser, lambda d: page_status(d) == "succeeded")
    # Created since: later than every execution leaves none, and offers no next page.
    browser.get(f"{server.url}/console#/executions?since=2999-01-01T00:00:00")
    wait_until(browser, lambda d: "No execution here." in text_of(d, ".paging"))
    assert browser.find_elements("css selector", "#executions-rows tr") == []
    browser.get(f"{server.url}/console#/executions?since=2000-01-01T00:00:00")
    wait_until(browser, lambda d: row_status(d, held["execution_id"]) == "running")
    assert console_errors(browser) == []


def test_an_execution_is_drawn_and_its_request_answered_through_the_form(
    server_factory: Start, tmp_path: Path, browser: Any
) -> None:
    server = serve(server_factory, tmp_path)
    asked = start(server, ALICE, "order", {})
    open_console(browser, server, ALICE, f"#/executions/{asked['execution_id']}")
    css(browser, "form.answer")
    texts = [t.text for t in browser.find_elements("css selector", "#timeline text")]
    assert "attempt 1" in texts
    assert f"replica {asked['replica']}" in texts
    assert json.loads(text_of(browser, "#prompt"))["markup"] == MARKUP  # as text

    def field(name: str) -> Any:
        label = browser.find_element("xpath", f'//form[@class="answer"]//label[text()="{name}"]')
        return browser.find_element("id", label.get_attribute("for"))

    from selenium.webdriver.support.ui import Select

    field("approved").click()
    field("amount").send_keys("7")
    field("ratio").send_keys("0.5")
    field("note").send_keys(MARKUP)
    Select(field("color")).select_by_visible_text('"blue"')
    field("city").send_keys("Oslo")
    field("floor").send_keys("3")
    field("tags").send_keys("first\nsecond")
    browser.find_element("xpath", '//form[@class="answer"]//button[text()="Answer"]').click()
    wait_until(browser, lambda d: page_status(d) == "succeeded")
    expected = {
        "approved": True,
        "amount": 7,
        "ratio": 0.5,
        "note": MARKUP,
        "color": "blue",
        "address": {"city": "Oslo", "floor": 3},
        "tags": ["first", "second"],
    }
    with api(server, ALICE) as client:
        record = client.get(f"/executions/{asked['execution_id']}").json()
    assert record["status"] == "succeeded"
    assert record["result"] == expected
    assert json.loads(text_of(browser, "#result")) == expected
    events = browser.find_elements("css selector", '#events li[data-event="input_required"]')
    assert events  # the request, live
    assert browser.find_elements("css selector", "form.answer") == []
    nothing_injected(browser)
    assert console_errors(browser) == []


def rerun_ready(driver: Any, execution_id: str) -> None:
    """The page shows `execution_id`, its Run again field filled from the server."""
    wait_until(
        driver,
        lambda d: (
            text_of(d, "#record dd") == execution_id
            and d.execute_script("return document.getElementById('rerun-input').value") != ""
        ),
    )


def test_cancel_and_run_again(server_factory: Start, tmp_path: Path, browser: Any) -> None:
    """Run again on an execution this tab never started: its input is the one the server
    kept (`GET /executions/{id}/input`), and the new execution ends as the first did; the
    field stays editable, and an edited input is what the next run gets."""
    server = serve(server_factory, tmp_path)
    body = {"text": f"once more {MARKUP} ✓ \u2028"}
    first = start(server, ALICE, "echo", body)
    open_console(browser, server, ALICE, f"#/executions/{first['execution_id']}")
    wait_until(browser, lambda d: page_status(d) == "succeeded")
    rerun_ready(browser, first["execution_id"])
    assert json.loads(css(browser, "#rerun-input").get_attribute("value")) == body
    assert text_of(browser, "#rerun-hint") == "The input it was started with."
    browser.find_element("xpath", '//button[text()="Run again"]').click()
    wait_until(
        browser,
        lambda d: d.execute_script("return location.hash").split("/")[-1] != first["execution_id"],
    )
    second_id = browser.execute_script("return location.hash").split("/")[-1]
    wait_until(browser, lambda d: page_status(d) == "succeeded")
    with api(server, ALICE) as client:
        before = client.get(f"/executions/{first['execution_id']}").json()
        again = client.get(f"/executions/{second_id}").json()
        kept = client.get(f"/executions/{second_id}/input")
    assert (again["reasoner"], again["status"]) == ("echo", "succeeded")
    assert again["result"] == before["result"] == body
    assert kept.status_code == 200 and kept.json() == body
    assert f"{server.url}/executions/{first['execution_id']}/input" in requested_urls(browser)
    # The field is the user's to change: an edited input is the one the next run gets.
    rerun_ready(browser, second_id)
    box = css(browser, "#rerun-input")
    box.clear()
    box.send_keys('{"text": "edited"}')
    browser.find_element("xpath", '//button[text()="Run again"]').click()
    wait_until(
        browser, lambda d: d.execute_script("return location.hash").split("/")[-1] != second_id
    )
    wait_until(browser, lambda d: page_status(d) == "succeeded")
    assert json.loads(text_of(browser, "#result")) == {"text": "edited"}
    nothing_injected(browser)

    held = start(server, ALICE, "hold", {})
    browser.get(f"{server.url}/console#/executions/{held['execution_id']}")
    wait_until(browser, lambda d: page_status(d) == "running")
    wait_until(browser, lambda d: d.find_elements("css selector", Events))
    browser.find_element("xpath", '//button[text()="Cancel"]').click()
    wait_until(browser, lambda d: page_status(d) == "cancelled")
    with api(server, ALICE) as client:
        ended = client.get(f"/executions/{held['execution_id']}").json()
    assert (ended["status"], ended["status_reason"]) == ("cancelled", "request")
    assert console_errors(browser) == []


def test_markup_in_every_value_is_shown_as_text(
    server_factory: Start, tmp_path: Path, browser: Any
) -> None:
    server = serve(server_factory, tmp_path)
    marked = start(server, ALICE, "marked", {"text": MARKUP})
    exploded = start(server, ALICE, "explode", {"text": MARKUP})
    open_console(browser, server, ALICE, f"#/executions/{marked['execution_id']}")
    wait_until(browser, lambda d: page_status(d) == "succeeded")
    wait_until(browser, lambda d: d.find_elements("css selector", Events))
    assert json.loads(text_of(browser, "#result")) == {"text": MARKUP}
    shown = text_of(browser, '#events li[data-event="progress"] code')
    assert json.loads(shown) == {"note": MARKUP}
    nothing_injected(browser)
    browser.get(f"{server.url}/console#/executions/{exploded['execution_id']}")
    wait_until(browser, lambda d: page_status(d) == "failed")
    assert json.loads(text_of(browser, "#error"))["message"] == MARKUP
    browser.get(f"{server.url}/console#/executions")
    wait_until(browser, lambda d: row_status(d, exploded["execution_id"]) == "failed")
    nothing_injected(browser)
    assert console_errors(browser) == []


def test_the_schedules_view_shows_next_fire_and_enables_disables_triggers(
    server_factory: Start, tmp_path: Path, browser: Any
) -> None:
    server = serve(server_factory, tmp_path)
    with api(server, ALICE) as client:
        made = client.post(
            "/schedules",
            json={"reasoner": "echo", "cron": "0 0 1 1 *", "input": {"text": "yearly"}},
        )
        assert made.status_code == 201, made.text
        schedule = made.json()
    with api(server, BOB) as client:
        theirs = client.post(
            "/schedules", json={"reasoner": "echo", "cron": "0 0 1 1 *", "input": {"text": "b"}}
        ).json()
    open_console(browser, server, ALICE)
    browser.find_element("link text", "Schedules").click()
    row = f'#schedule-rows tr[data-id="{schedule["schedule_id"]}"]'
    wait_until(browser, lambda d: schedule["next_fire_at"] in text_of(d, row))
    assert "none yet" in text_of(browser, row)
    assert theirs["schedule_id"] not in browser.page_source  # another tenant's
    button = '//tr[@data-id="{}"]//button[text()="{}"]'
    browser.find_element("xpath", button.format(schedule["schedule_id"], "Trigger")).click()
    wait_until(browser, lambda d: "succeeded" in text_of(d, f"{row} td:nth-child(7)"))
    browser.find_element("xpath", button.format(schedule["schedule_id"], "Disable")).click()
    wait_until(browser, lambda d: text_of(d, f"{row} td:nth-child(5)") == "no")
    with api(server, ALICE) as client:
        assert client.get(f"/schedules/{schedule['schedule_id']}").json()["enabled"] is False
        firings = client.get("/executions", params={"schedule_id": schedule["schedule_id"]})
    [firing] = firings.json()
    assert firing["result"] == {"text": "yearly"}
    # Run again on a schedule's firing starts with its schedule's input.
    browser.get(f"{server.url}/console#/executions/{firing['execution_id']}")
    wait_until(browser, lambda d: page_status(d) == "succeeded")
    wait_until(
        browser,
        lambda d: (
            d.execute_script("return document.getElementById('rerun-input').value")
            == '{"text":"yearly"}'
        ),
    )
    assert console_errors(browser) == []


def test_the_replicas_view_shows_in_flight_and_the_drain(
    server_factory: Start, tmp_path: Path, browser: Any
) -> None:
    server = serve(server_factory, tmp_path, "--grace-period", "40", "--replica-id", "pod-a")
    with api(server, ALICE) as client:
        assert client.get("/replicas").status_code == 403  # it spans tenants
    held = start(server, ALICE, "hold", {})
    open_console(browser, server, ROOT)
    browser.find_element("link text", "Replicas").click()
    row = '#replica-rows tr[data-id="pod-a"]'
    wait_until(browser, lambda d: text_of(d, f"{row} .in-flight") == "1")
    assert "pod-a" in text_of(browser, row)
    assert text_of(browser, f"{row} .state") == "admitting"
    assert held["replica"] == "pod-a"
    server.signal(signal.SIGTERM)
    wait_until(browser, lambda d: text_of(d, f"{row} .state") == "draining")
    wait_until(browser, lambda d: text_of(d, f"{row} .phase") == "draining")
    left = float(text_of(browser, f"{row} .deadline").removesuffix(" s"))
    assert 0 < left <= 40
    assert console_errors(browser) == []


def test_no_console_is_404(server_factory: Start) -> None:
    off = server_factory(APP, "--no-console")
    assert httpx.get(f"{off.url}/console", timeout=5).status_code == 404
    assert httpx.get(f"{off.url}/console/console.js", timeout=5).status_code == 404
    on = server_factory(APP)
    assert httpx.get(f"{on.url}/console/nothing.js", timeout=5).status_code == 404
    assert httpx.post(f"{on.url}/console", timeout=5).status_code == 405


def test_replicas_lists_every_live_replica_of_a_shared_store(
    server_factory: Start, tmp_path: Path, store_url: str, request: pytest.FixtureRequest
) -> None:
    """Each replica writes itself with its renewal: any replica lists the others, their
    in-flight counts and a drain, and drops one that is gone (Redis and Postgres)."""
    shared = ["--store", store_url, "--lease-ttl", "1", "--grace-period", "40"]
    first = serve(server_factory, tmp_path, *shared, "--replica-id", "pod-a")
    second = serve(server_factory, tmp_path, *shared, "--replica-id", "pod-b")
    held = start(second, ALICE, "hold", {})
    assert held["replica"] == "pod-b"

    def listed() -> dict[str, dict[str, Any]]:
        with api(first, ROOT) as client:
            answer = client.get("/replicas")
        assert answer.status_code == 200
        return {replica["replica_id"]: replica for replica in answer.json()}

    def until(condition: Callable[[dict[str, dict[str, Any]]], bool]) -> dict[str, Any]:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            found = listed()
            if condition(found):
                return found
            time.sleep(0.1)
        raise AssertionError(f"not seen within {WAIT} s: {listed()}")

    found = until(lambda r: r.get("pod-b", {}).get("in_flight") == 1)
    assert found["pod-a"]["answering"] and not found["pod-b"]["answering"]
    assert found["pod-b"]["admitting"] and found["pod-b"]["phase"] == "serving"
    second.signal(signal.SIGTERM)
    found = until(lambda r: r.get("pod-b", {}).get("phase") == "draining")
    assert found["pod-b"]["draining"] and not found["pod-b"]["admitting"]
    assert 0 < found["pod-b"]["deadline_seconds"] <= 40
    second.signal(signal.SIGKILL)
    until(lambda r: "pod-b" not in r)
    if not store_url.startswith("redis"):
        return  # on Postgres a description is read only while its lease holds
    redis_server = request.getfixturevalue("redis_server")
    # Once the renewals drop the dead replica, a read drops its description too.
    states = "{agent-server:console-tests}:states"
    until(lambda r: redis_server.command("HEXISTS", states, "pod-b") == b":0\r\n")
    assert redis_server.command("HEXISTS", states, "pod-a") == b":1\r\n"


def test_a_hand_off_is_drawn_as_a_second_attempt_on_its_new_replica(
    server_factory: Start, tmp_path: Path, redis_url: str, browser: Any
) -> None:
    """Attempt 1 keeps the replica it ran on and its hand-off, attempt 2 names the one that
    took it: drawn live on a page open through the drain, and from the store's history on
    a page opened after it (what no tab saw)."""
    shared = ["--store", redis_url, "--lease-ttl", "1", "--grace-period", "10"]
    first = serve(
        server_factory, tmp_path, *shared, "--drain-timeout", "1", "--replica-id", "pod-a"
    )
    second = serve(server_factory, tmp_path, *shared, "--replica-id", "pod-b")
    moving = start(first, ALICE, "steps", {})
    assert moving["replica"] == "pod-a"
    page = f"#/executions/{moving['execution_id']}"
    open_console(browser, second, ALICE, page)

    def timeline(d: Any) -> list[str]:
        return list(
            d.execute_script(
                "return [...document.querySelectorAll('#timeline text')].map(t => t.textContent)"
            )
        )

    def drawn_handed_off(d: Any) -> bool:
        drawn = timeline(d)
        return "attempt 2" in drawn and "replica pod-b" in drawn and "handed off" in drawn

    wait_until(browser, lambda d: "replica pod-a" in timeline(d))
    first.signal(signal.SIGTERM)
    wait_until(browser, drawn_handed_off)
    # A page opened now, in a tab that saw nothing of it, draws the same from the store.
    browser.switch_to.new_window("tab")  # no opener: nothing of the first tab's storage
    open_console(browser, second, ALICE, page)
    wait_until(browser, drawn_handed_off)
    drawn = timeline(browser)
    assert drawn.index("attempt 1") < drawn.index("replica pod-a") < drawn.index("attempt 2")
    assert "pod-a" in text_of(browser, "#attempts tbody tr:nth-child(1)")
    assert "handed off" in text_of(browser, "#attempts tbody tr:nth-child(1)")
    assert "pod-b" in text_of(browser, "#attempts tbody tr:nth-child(2)")
    with api(second, ALICE) as client:
        history = client.get(f"/executions/{moving['execution_id']}/history").json()
        client.post(f"/executions/{moving['execution_id']}/cancel")
    assert [(m["move"], m["replica"]) for m in history] == [
        ("hand_off", "pod-a"),
        ("claim", "pod-b"),
    ], history
    wait_until(browser, lambda d: page_status(d) == "cancelled")


def test_the_screenshot_script_runs(tmp_path: Path) -> None:
    """bench/console_screenshots.py (docs/console.md's pictures) still makes its pictures."""
    need("chromium", package="chromium")
    need("chromedriver", package="chromium-driver")
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run(
        [sys.executable, str(root / "bench" / "console_screenshots.py"), str(tmp_path)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    for name in ("executions.png", "execution.png", "replicas.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
