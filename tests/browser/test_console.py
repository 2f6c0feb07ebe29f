"""The console end to end in Chromium: sign in, make a key and use it with the SDK, see it in
Requests and Usage, download the CSV and check it against the usage report, revoke the key,
and a client key's own page. Screenshots of each view (see conftest.py)."""

from __future__ import annotations

import csv
import datetime
import io
import re
from pathlib import Path
from typing import Any

import anthropic
import pytest

from tests.support.fakes import FakeUpstream, completion, text_stream
from tests.support.keys import ADMIN, admin, ask, create, keys_config, listing
from tests.support.waiting import eventually


@pytest.fixture
def url(upstream: FakeUpstream, gateway_from: Any) -> str:
    return gateway_from(keys_config(upstream.url, server={"default_model": "test-model"})).url


def sign_in(page: Any, url: str, key: str) -> None:
    page.goto(url + "/console")
    assert page.url.endswith("/console/signin")
    page.get_by_test_id("signin-key").fill(key)
    page.get_by_test_id("signin-submit").click()
    page.wait_for_load_state()
    assert key not in page.content() and key not in page.url


def make_key(page: Any, url: str, name: str) -> str:
    page.goto(url + "/console/keys")
    page.get_by_test_id("key-create").click()
    page.get_by_test_id("key-name").fill(name)
    page.get_by_test_id("key-create-submit").click()
    secret = page.get_by_test_id("key-secret")
    secret.wait_for(state="visible")
    value: str = secret.text_content() or ""
    assert value.startswith("sk-dm-")
    page.get_by_test_id("keys-table").get_by_role("cell", name=name, exact=True).wait_for()
    return value


def test_an_admin_makes_uses_watches_and_revokes_a_key(url: str, upstream: FakeUpstream, new_page: Any,
                                                       shot: Any) -> None:  # fmt: skip
    page = new_page()
    page.goto(url + "/console/signin")
    shot(page, "signin")
    sign_in(page, url, ADMIN)
    assert page.url.endswith("/console")
    secret = make_key(page, url, "alice")
    page.get_by_role("button", name="Done").click()
    page.reload()
    assert secret not in page.content()  # shown once

    upstream.json_reply(completion("hello", prompt=13, completion_tokens=7))
    assert ask(url, secret).content[0].text == "hello"
    traffic(url, upstream)

    page.goto(url + "/console/requests")
    requests = page.get_by_test_id("requests-table")
    requests.get_by_role("cell", name="alice", exact=True).first.wait_for()
    page.get_by_label("Failures first").check()
    requests.locator("tbody tr").first.get_by_role("cell", name="api_error").wait_for()
    shot(page, "requests")

    page.goto(url + "/console")
    page.get_by_test_id("overview-chart").locator("canvas").first.wait_for()
    shot(page, "overview")

    page.goto(url + "/console/usage")
    page.get_by_test_id("usage-period").select_option("hour")
    page.get_by_test_id("usage-bucket").select_option("1m")
    page.get_by_test_id("usage-table").get_by_role("row", name="alice").get_by_role(
        "cell", name="13", exact=True
    ).wait_for()
    shot(page, "usage")
    with page.expect_download() as download:
        page.get_by_test_id("usage-csv").click()
    check_csv_against_report(url, Path(download.value.path()), download.value.suggested_filename)

    page.goto(url + "/console/replicas")
    page.get_by_test_id("replicas-table").locator("tbody tr").first.wait_for()
    shot(page, "replicas")

    edit_and_revoke(page, url, secret, shot)


def traffic(url: str, upstream: FakeUpstream) -> None:
    """Another key of a tenant, with answers and an upstream failure (for Requests and the charts)."""
    bot = create(url, name="build-bot", tenant="ci", models=["test-*"], limits={"requests_per_minute": 60},
                 budget={"amount": "2000", "currency": "USD", "period": "month"})  # fmt: skip
    create(url, name="carol", tenant="research")
    for prompt in (120, 80):
        upstream.json_reply(completion("ok", prompt=prompt, completion_tokens=40, cached=prompt // 2))
        ask(url, bot["key"])
    upstream.stream_reply(text_stream("a", "stream", prompt=60))
    assert len(list(ask(url, bot["key"], stream=True))) > 3  # a stream: a time to first token
    upstream.json_reply({"error": {"message": "boom"}}, status=500)
    with pytest.raises(anthropic.APIError):
        ask(url, bot["key"])


def edit_and_revoke(page: Any, url: str, secret: str, shot: Any) -> None:
    """Search, edit limits through the form (the Admin API sees them), then revoke: the SDK gets 401."""
    page.goto(url + "/console/keys")
    table = page.get_by_test_id("keys-table")
    page.get_by_test_id("key-search").fill("research")
    table.get_by_role("cell", name="carol", exact=True).wait_for()
    assert table.locator("tbody tr").count() == 1
    page.get_by_test_id("key-search").fill("")
    table.get_by_role("cell", name="build-bot", exact=True).wait_for()
    shot(page, "keys")
    page.get_by_role("button", name="Edit alice").click()
    page.get_by_label("Requests per minute").fill("42")
    page.get_by_label("Models (comma-separated names or globs; empty: all)").fill("test-*")
    page.get_by_test_id("key-create-submit").click()
    table.get_by_role("cell", name="requests per minute 42").wait_for()
    alice = next(k for k in listing(url, limit=100)["data"] if k["name"] == "alice")
    assert alice["limits"] == {"requests_per_minute": 42} and alice["models"] == ["test-*"]
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Revoke alice").click()
    table.get_by_role("row", name="alice").get_by_role("cell", name="inactive").wait_for()
    with pytest.raises(anthropic.AuthenticationError):
        ask(url, secret)


def check_csv_against_report(url: str, path: Path, filename: str) -> None:
    """The CSV's tokens per key equal the usage report's over the same window and buckets."""
    start, end = map(int, re.findall(r"-(\d{9,})", filename))
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    assert rows, "the CSV has the request's bucket"
    iso = lambda t: datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat().replace("+00:00", "Z")  # noqa: E731
    report: Any = admin(url).get("/v1/organizations/usage_report/messages", cast_to=object, options={"params": {
        "starting_at": iso(start), "ending_at": iso(end), "bucket_width": "1m", "group_by[]": "api_key_id",
        "limit": 1440}})  # fmt: skip
    reported: dict[str, tuple[int, int]] = {}
    for bucket in report["data"]:
        for result in bucket["results"]:
            held = reported.get(result["api_key_id"], (0, 0))
            reported[result["api_key_id"]] = (
                held[0] + result["uncached_input_tokens"],
                held[1] + result["output_tokens"],
            )
    shown: dict[str, tuple[int, int]] = {}
    for row in rows:
        held = shown.get(row["group"], (0, 0))
        shown[row["group"]] = (held[0] + int(row["input_tokens"]), held[1] + int(row["output_tokens"]))
    assert shown == reported


def test_a_client_key_sees_its_own_page_only(url: str, new_page: Any, shot: Any) -> None:
    made = create(url, name="bob", limits={"requests_per_minute": 30},
                  budget={"amount": "500", "currency": "USD", "period": "month"})  # fmt: skip
    page = new_page()
    page.goto(url + "/console/me")
    page.get_by_test_id("signin-key").focus()  # by keyboard alone
    page.keyboard.type(made["key"])
    page.keyboard.press("Enter")
    page.wait_for_url("**/console/me")
    assert made["key"] not in page.content()
    eventually(lambda: "bob" in (page.get_by_test_id("me-key").text_content() or ""), timeout=10)
    assert "requests per minute" in (page.get_by_test_id("me-key").text_content() or "")
    shot(page, "me")
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url) if "/console/data/" in request.url else None)
    page.wait_for_timeout(5500)  # a live view asks its one endpoint at most once per 5 s
    assert len(asked) <= 2 and {u.split("?")[0] for u in asked} <= {url + "/console/data/me"}
    refused = page.goto(url + "/console/keys")
    assert refused is not None and refused.status == 403
    page.goto(url + "/console/me")
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url("**/console/signin")
    page.goto(url + "/console/me")
    assert page.url.endswith("/console/signin")  # the session is gone


FORGERY = """<!doctype html><title>elsewhere</title>
<form id="f" method="post" action="{url}/console/data/keys" enctype="text/plain">
  <input name='{{"name": "forged", "x": "' value='"}}'></form>
<script>document.getElementById("f").submit();</script>"""


def test_a_page_on_another_site_cannot_make_a_key(url: str, new_page: Any) -> None:
    """Signed in, the browser visits another site whose page posts a form to the console: no
    key is made (the cookie is SameSite=Strict, and the change carries no token). A fetch from
    it would not even be sent: Chromium keeps public sites from loopback addresses."""
    page = new_page()
    sign_in(page, url, ADMIN)
    page.route("http://elsewhere.test/**", lambda route: route.fulfill(content_type="text/html",
                                                                       body=FORGERY.format(url=url)))  # fmt: skip
    with page.expect_response(lambda r: r.request.method == "POST" and "/console/data/keys" in r.url
                              and r.request.resource_type == "document") as posted:  # fmt: skip
        page.goto("http://elsewhere.test/")
    assert posted.value.status in (401, 403)
    assert not [k for k in listing(url, limit=100)["data"] if k["name"].startswith("forged")]
