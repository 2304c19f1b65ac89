"""The documentation site as a reader sees it, in real Chromium (issue 36, items 3 and 5).

The site is built with Sphinx (as `make docs` does) and opened from its files: the header has a
tab per audience, the theme's search finds pages (the search box and its results page work
without a server), and the users' pages open from the header.  Screenshots go to
test-artifacts/<test>/.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .test_browser import by_css, click

REPO = Path(__file__).resolve().parents[2]
AUDIENCES = ("Using it", "Running it", "Reference", "How it works", "Contributing")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "html"
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html",
                           str(REPO / "docs"), str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def header_tabs(browser) -> list[str]:
    return [a.text.strip() for a in browser.driver.find_elements(*by_css(".bd-header .bd-navbar-elements a.nav-link"))]


def test_the_sites_search_and_header_in_chromium(site, browser):
    b = browser("reader")
    b.driver.get((site / "index.html").as_uri())
    b.wait(lambda d: header_tabs(b), 30, "the header shows no navigation")
    assert set(AUDIENCES) <= set(header_tabs(b)), header_tabs(b)
    b.shot("front-page")

    # The header's search button opens the theme's search box; Enter shows the results page.
    from selenium.webdriver.common.keys import Keys

    click(b, ".bd-header button.search-button")
    box = b.wait(lambda d: next((e for e in d.find_elements(*by_css("#pst-search-dialog[open] input[name='q']"))
                                 if e.is_displayed()), None), 30, "the search button opened no search box")
    box.send_keys("culled", Keys.ENTER)
    b.wait(lambda d: "search.html" in d.current_url, 30, "Enter in the search box did not open the results page")

    def results(d) -> list[str]:
        return [a.get_attribute("href") or "" for a in d.find_elements(*by_css("#search-results li a"))]

    found = b.wait(results, 60, "the search page found nothing for 'culled'")
    assert any(href.split("?")[0].endswith("users/culling.html") for href in found), found
    b.shot("search-results")

    # A reader who picks "Using it" in the header lands on the users' index.
    b.driver.get((site / "index.html").as_uri())
    click(b, ".bd-header .bd-navbar-elements a.nav-link[href='users/index.html']")
    b.wait(lambda d: d.current_url.endswith("users/index.html"), 30, "the Using it tab leads elsewhere")
    assert "Using it" in b.driver.find_element(*by_css("h1")).text


def test_the_first_day_tutorial_page_shows_its_pictures(site, browser):
    b = browser("reader")
    b.driver.get((site / "users" / "index.html").as_uri())
    click(b, "article a[href='first-day.html']")
    b.wait(lambda d: d.current_url.endswith("users/first-day.html"), 30, "the users' index has no link to the tutorial")
    steps = b.driver.find_elements(*by_css("article ol > li"))
    assert len(steps) >= 10, [s.text[:40] for s in steps]
    # Every step's screenshot is there and loaded (a picture the tests no longer make would be missing).
    images = b.wait(lambda d: d.find_elements(*by_css("article img")), 30, "the tutorial shows no picture")
    assert len(images) >= 9
    broken = [i.get_attribute("src") for i in images
              if not b.driver.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", i)]
    assert not broken, broken
    b.driver.execute_script("window.scrollTo(0, 0)")
    b.shot("first-day-page")
