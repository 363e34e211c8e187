"""Debian's chromium, headless, driven by selenium through Debian's chromedriver (`.ci/run`
installs both): the browser the pages' tests (`/docs`, `/console`) drive, and what it
tells of them (the URLs it requested, its console errors)."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from tests.support.process import need

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


@contextlib.contextmanager
def chromium(window: str = "1280,900") -> Iterator[Any]:
    """A fresh browser (its own profile), closed at the end."""
    binary = need("chromium", package="chromium")
    chromedriver = need("chromedriver", package="chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="page-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in [*FLAGS, f"--user-data-dir={profile}", f"--window-size={window}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    # Both paths given, so selenium never looks for (or downloads) a driver of its own.
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    driver.set_page_load_timeout(WAIT)
    driver.set_script_timeout(WAIT)
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
