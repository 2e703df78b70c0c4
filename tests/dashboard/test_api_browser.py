"""The HTTP API's page (`/api/docs`) in a real browser: Playwright driving Debian's chromium,
reached from the dashboard's menu, listing every route of the table, with no script error
or CSP violation (the `page` fixture checks that), and its link to the OpenAPI document."""

from __future__ import annotations

import json
from typing import Any

from dashboard.test_dashboard_browser import (  # noqa: F401  (fixtures)
    dashboard_url,
    page,
    playwright_api,
    screenshot,
)
from sqla_queue.dashboard.api import ENDPOINTS, PREFIX


def test_the_api_page_lists_every_route_and_links_the_openapi_document(page: Any) -> None:  # noqa: F811
    expect = playwright_api.expect
    page.goto("/")
    page.get_by_role("link", name="API").click()
    expect(page.locator("h1")).to_have_text("HTTP API")
    rows = page.locator("#endpoints tbody tr")
    expect(rows).to_have_count(len(ENDPOINTS))
    for e in ENDPOINTS:
        row = rows.filter(has_text=f"{PREFIX}{e.path}").filter(has_text=e.method).first
        expect(row).to_contain_text(e.scope)
    retry = rows.filter(has_text=f"{PREFIX}/jobs/retry")
    expect(retry).to_contain_text("Idempotency-Key")
    expect(retry).to_contain_text("JobAction")
    screenshot(page, "dashboard-api.png")
    link = page.get_by_role("link", name=f"{PREFIX}/openapi.json")
    # fetched, not opened: a JSON tab would ask for /favicon.ico, a 404 the fixture counts
    document = json.loads(page.request.get(link.get_attribute("href")).text())
    assert document["openapi"] == "3.1.0"
    assert set(document["paths"]) == {e.path for e in ENDPOINTS}
