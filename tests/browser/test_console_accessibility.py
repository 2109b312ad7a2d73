"""Every console page at a phone's width, and what a keyboard or screen-reader user needs.

Checked on each page (Runs, a Run, Approvals, Dead letters, Schedules, Workflows, Start a
run, sign-in) in headless Chromium at 390 × 844 CSS pixels (a phone):

- the page does not scroll sideways (wide tables scroll inside their own box);
- exactly one ``h1``; every visible form control has an accessible name (a ``<label>``,
  ``aria-label`` or ``aria-labelledby``); every button and link has text;
- keyboard: Tab from the top reaches the navigation's "Runs" link, and the focused
  element is drawn with a visible outline.

SQLite only: the pages' markup does not depend on the database, and the journeys run on
both.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, ViewportSize

from tests.acceptance.conftest import Stack, token
from tests.browser.conftest import Browser

PHONE: ViewportSize = {"width": 390, "height": 844}

# JavaScript: the problems a page has, as text (empty when none).
_AUDIT = """() => {
  const problems = [];
  const root = document.documentElement;
  if (root.scrollWidth > window.innerWidth + 1)
    problems.push(`scrolls sideways: ${root.scrollWidth} > ${window.innerWidth}`);
  const h1 = document.querySelectorAll('h1').length;
  if (h1 !== 1) problems.push(`${h1} h1 elements`);
  const visible = (el) => !!(el.offsetWidth || el.offsetHeight || el.getClientRects().length);
  for (const el of document.querySelectorAll('input, select, textarea')) {
    if (el.type === 'hidden' || !visible(el)) continue;
    const named = (el.labels && el.labels.length) || el.getAttribute('aria-label')
      || el.getAttribute('aria-labelledby');
    if (!named) problems.push(`unlabelled ${el.tagName} name=${el.name}`);
  }
  for (const el of document.querySelectorAll('button, a[href]')) {
    if (!visible(el)) continue;
    const text = (el.innerText || el.getAttribute('aria-label') || el.title || '').trim();
    if (!text) problems.push(`${el.tagName} without text: ${el.outerHTML.slice(0, 80)}`);
  }
  return problems;
}"""


def _audit(page: Page, what: str) -> None:
    problems = page.evaluate(_AUDIT)
    assert problems == [], f"{what}: {problems}"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_every_page_fits_a_phone_and_names_its_controls(
    console_with_examples: Stack, browser: Browser
) -> None:
    page = browser.page
    page.set_viewport_size(PHONE)
    browser.goto("/ui/login", "phone-login")
    _audit(page, "sign-in")
    browser.sign_in(token(subject="alice"), name="phone-runs")
    with console_with_examples.client(token(subject="alice")) as api:
        started = api.post(
            "/runs",
            json={
                "workflow": "onboarding",
                "input": {"customer_id": "c-phone", "company": "Phone Ltd", "email": "a@b.test"},
            },
        )
        assert started.status_code == 201, started.text
        run_id = started.json()["run_id"]
    for path, name in [
        ("/ui/runs", "phone-runs"),
        (f"/ui/runs/{run_id}", "phone-run"),
        ("/ui/approvals", "phone-approvals"),
        ("/ui/dead-letters", "phone-dead-letters"),
        ("/ui/schedules", "phone-schedules"),
        ("/ui/workflows", "phone-workflows"),
        ("/ui/workflows/onboarding/start", "phone-start"),
    ]:
        browser.goto(path, name)
        _audit(page, path)

    # The audit itself finds what it looks for (a check that cannot fail proves nothing).
    # (The console's CSP refuses style attributes: the wide box is sized through the DOM.)
    page.evaluate(
        """() => {
          document.body.insertAdjacentHTML('beforeend', '<input name=bare><button></button>');
          const wide = document.createElement('div');
          wide.style.width = '2000px';
          wide.textContent = 'wide';
          document.body.appendChild(wide);
        }"""
    )
    found = " | ".join(page.evaluate(_AUDIT))
    assert "scrolls sideways" in found and "name=bare" in found and "BUTTON without" in found

    # Keyboard: Tab from the top of the page reaches the navigation, visibly focused.
    browser.goto("/ui/workflows", "keyboard")
    for _ in range(15):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent.trim()") == "Runs":
            break
    else:
        pytest.fail("Tab never reached the navigation's Runs link")
    outline = page.evaluate(
        "(() => { const s = getComputedStyle(document.activeElement);"
        " return [s.outlineStyle, s.outlineWidth, s.boxShadow]; })()"
    )
    assert outline[0] != "none" or outline[2] != "none", outline
    browser.screenshot("keyboard-focus", full_page=False)
