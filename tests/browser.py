"""Headless Chromium driven by Selenium, offline: Debian's `chromium` and `chromium-driver` (make test installs
them), never a browser or driver downloaded at run time (Selenium Manager is bypassed by naming the driver)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def require_browser() -> None:
    """Skip where no browser is installed, except in CI, where a missing browser is a failed set-up."""
    if Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists():
        return
    message = "headless Chromium is not installed (apt-get install chromium chromium-driver; `make test` does it)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def open_browser(width: int = 1400, height: int = 1000):
    """A headless Chromium that records its network requests and console messages."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"):
        options.add_argument(flag)
    options.add_argument(f"--window-size={width},{height}")
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def requested_urls(driver) -> list[str]:
    """Every URL the page asked for since the last call (from the DevTools network events)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls
