"""The usage report while its database is out: PostgreSQL stopped, or the table locked by
another connection. The report answers 503 `overloaded_error` with `retry-after` (never a
500, never a hang past the statement timeout), and requests go on meanwhile."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from tests.support.fakes import FakeUpstream, completion
from tests.support.postgres import PrivatePostgres, locked, pg_url, private_postgres  # noqa: F401 (fixtures)
from tests.support.usage import KEYS, report, team_config

pytestmark = pytest.mark.heavy  # several processes: the full suite runs it, --fast leaves it out

ASK: dict[str, Any] = {"model": "test-model", "max_tokens": 20, "messages": [{"role": "user", "content": "Hi"}]}


def _unavailable(url: str) -> anthropic.APIStatusError:
    with pytest.raises(anthropic.APIStatusError) as raised:
        report(url)
    return raised.value


def _assert_503(error: anthropic.APIStatusError) -> None:
    assert error.status_code == 503
    assert error.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    assert error.response.headers["retry-after"] == "5"


def test_the_report_answers_503_while_postgres_is_stopped(
    upstream: FakeUpstream,
    private_postgres: PrivatePostgres,  # noqa: F811
    gateway_from: Any,
) -> None:
    server = gateway_from(team_config(upstream.url, {"database_url": private_postgres.url, "statement_timeout": 2}))
    assert report(server.url)["data"]  # reachable: a report
    private_postgres.stop()
    upstream.json_reply(completion("x"))
    client = anthropic.Anthropic(base_url=server.url, api_key=KEYS["team-a"], max_retries=0)
    client.messages.create(**ASK)  # requests go on
    _assert_503(_unavailable(server.url))
    _assert_503(_unavailable(server.url))
    private_postgres.start()
    assert report(server.url)["data"][-1]["results"][0]["uncached_input_tokens"] == 10  # held, then written


def test_a_locked_table_answers_503_within_the_statement_timeout(
    upstream: FakeUpstream,
    pg_url: str,  # noqa: F811
    gateway_from: Any,
) -> None:
    server = gateway_from(team_config(upstream.url, {"database_url": pg_url, "statement_timeout": 1}))
    report(server.url)  # the table is there
    with locked(pg_url, "usage_records"):
        client = anthropic.Anthropic(base_url=server.url, api_key=KEYS["team-a"], max_retries=0)
        for _ in range(3):  # the request path does not wait for the table
            upstream.json_reply(completion("x"))
            client.messages.create(**ASK)
        _assert_503(_unavailable(server.url))
    assert report(server.url)["data"][-1]["results"][0]["uncached_input_tokens"] == 30  # written once unlocked


def test_the_key_admin_api_and_cost_report_answer_503_while_postgres_is_stopped(
    upstream: FakeUpstream,
    private_postgres: PrivatePostgres,  # noqa: F811
    gateway_from: Any,
) -> None:
    """Keys live in the same database: a change cannot be made meanwhile, and says so."""
    from tests.support.keys import admin, create, keys_config, listing

    server = gateway_from(keys_config(upstream.url, usage={"database_url": private_postgres.url}))
    made = create(server.url, name="ci")
    assert listing(server.url)["data"]
    private_postgres.stop()
    for call in (lambda: listing(server.url), lambda: create(server.url, name="other"),
                 lambda: admin(server.url).get("/v1/organizations/cost_report", cast_to=object,
                                               options={"params": {"starting_at": "2026-01-01T00:00:00Z"}})):  # fmt: skip
        with pytest.raises(anthropic.APIStatusError) as raised:
            call()
        _assert_503(raised.value)
    private_postgres.start()
    assert made["id"] in {k["id"] for k in listing(server.url)["data"]}
