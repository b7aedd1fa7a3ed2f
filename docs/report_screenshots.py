"""The README's two pictures of a run report, taken with headless Chromium (see tests/browser.py):

make smoke && python docs/report_screenshots.py outputs/smoke/report.html
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tests.browser import open_browser

DOCS = Path(__file__).resolve().parent


def main(html: Path) -> None:
    driver = open_browser(1300, 900)
    try:
        driver.get(html.resolve().as_uri())
        driver.save_screenshot(str(DOCS / "report_overview.png"))  # the top: runs and training curves
        Select(driver.find_element(By.ID, "filter-code")).select_by_value("yes")
        Select(driver.find_element(By.ID, "filter-outcome")).select_by_value("wrong")
        driver.execute_script("window.scrollTo(0, document.getElementById('trajectories').offsetTop - 110)")
        driver.save_screenshot(str(DOCS / "report_trajectories.png"))  # wrong answers that used code
    finally:
        driver.quit()


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "outputs/smoke/report.html"))
