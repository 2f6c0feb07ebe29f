"""Money budgets and the cost report: a mixed run of three priced models (whole replies,
streams, streams the client cut, prompt-cache reads and writes, an upstream error) costs, to
the cent, the prices times the usage the SDK saw, in the report and in what the budget
enforces; a budget spent is a 429 the SDK does not retry, naming it and its reset."""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Any

import anthropic
import pytest

from tests.support.fake_anthropic import FakeAnthropic, NativeReply, text_events
from tests.support.fakes import FakeUpstream, completion, text_stream
from tests.support.keys import admin, ask, create, keys_config, retrieve, update
from tests.support.usage import wait_recorded
from tests.support.waiting import eventually

PRICES = {"cheap": {"input": 0.30, "output": 1.20}, "dear": {"input": 3.0, "output": 15.0, "cache_read": 0.30},
          "native": {"input": 1.0, "output": 5.0, "cache_read": 0.10, "cache_write": 1.25}}  # fmt: skip
# A cost report result's fields, as Anthropic's.
COST_FIELDS = {"amount", "currency", "cost_type", "description", "model", "service_tier", "context_window",
               "token_type", "inference_geo", "workspace_id"}  # fmt: skip
CUT_TEXT = "the first words of a longer answer"  # 34 bytes relayed: 9 output tokens counted


@pytest.fixture
def server(upstream: FakeUpstream, native: FakeAnthropic, gateway_from: Any) -> Any:
    models: list[dict[str, Any]] = [{"name": n, "upstream": "default", "upstream_model": "test-model", "price": p}
                                    for n, p in PRICES.items() if n != "native"]  # fmt: skip
    models.append({"name": "native", "upstream": "native", "upstream_model": "native-model", "price": PRICES["native"]})
    models[1]["aliases"] = ["claude-*"]  # dear, as Claude Code names it
    models.append({"name": "free", "upstream": "default", "upstream_model": "test-model"})
    native_upstream = {"native": {"url": native.url, "protocol": "anthropic", "max_retries": 0}}
    server = {"default_model": "native"}  # a name no model has goes there
    return gateway_from(keys_config(upstream.url, models=models, upstreams=native_upstream, server=server))


@pytest.fixture
def url(server: Any) -> str:
    return server.url  # type: ignore[no-any-return]


def _cost(model: str, usage: Any) -> Decimal:
    """Cents, from the prices (USD per million tokens) and the usage as the SDK shows it."""
    price = {k: Decimal(str(v)) for k, v in PRICES[model].items()}
    tokens = {
        "input": usage.input_tokens,
        "output": usage.output_tokens,
        "cache_read": usage.cache_read_input_tokens or 0,
        "cache_write": usage.cache_creation_input_tokens or 0,
    }
    return sum((price.get(k, Decimal(0)) * n for k, n in tokens.items()), Decimal(0)) / Decimal(10_000)


def _cut(client: anthropic.Anthropic, native: FakeAnthropic) -> Decimal:
    """A passthrough stream the client leaves after its first words: what it saw of its usage
    (message_start's), with the text relayed as the gateway counts it (4 bytes a token)."""
    events = text_events(CUT_TEXT, input_tokens=300, cache_read_input_tokens=40, cache_creation_input_tokens=20)
    native.replies.append(NativeReply(events=[*events[:3], ("sleep", 30), *events[3:]]))
    ask = {"model": "native", "max_tokens": 50, "messages": [{"role": "user", "content": "Hi"}]}
    with client.messages.stream(**ask) as stream:  # type: ignore[arg-type]
        for event in stream:
            if event.type == "text":
                usage = stream.current_message_snapshot.usage
                relayed = -(-len(event.text.encode()) // 4)
                return _cost("native", usage.model_copy(update={"output_tokens": max(usage.output_tokens, relayed)}))
    raise AssertionError("the stream ended before its first words")


def test_a_mixed_run_costs_the_prices_times_the_usage_the_sdk_saw(
    server: Any, url: str, upstream: FakeUpstream, native: FakeAnthropic
) -> None:
    made = create(url, name="spender", budget={"amount": "100000", "period": "day"})
    client = anthropic.Anthropic(base_url=url, api_key=made["key"], max_retries=0)
    expected = Decimal(0)
    upstream.json_reply(completion("a", prompt=1234, completion_tokens=567))
    expected += _cost("cheap", ask(url, made["key"], model="cheap", max_tokens=600).usage)
    upstream.json_reply(completion("b", prompt=4000, completion_tokens=33, cached=3000))
    expected += _cost("dear", ask(url, made["key"], model="dear", max_tokens=100).usage)
    upstream.stream_reply(text_stream("one ", "two ", "three", prompt=777))
    with client.messages.stream(model="dear", max_tokens=50, messages=[{"role": "user", "content": "Hi"}]) as stream:
        expected += _cost("dear", stream.get_final_message().usage)
    upstream.stream_reply(text_stream("x", prompt=55))
    with client.messages.stream(model="cheap", max_tokens=50, messages=[{"role": "user", "content": "Hi"}]) as stream:
        expected += _cost("cheap", stream.get_final_message().usage)
    native.replies.append(NativeReply(events=text_events("whole", input_tokens=900, cache_creation_input_tokens=60)))
    with client.messages.stream(model="native", max_tokens=50, messages=[{"role": "user", "content": "Hi"}]) as stream:
        expected += _cost("native", stream.get_final_message().usage)
    expected += _cut(client, native)  # cut mid-stream by the client
    expected += _cut(client, native)
    upstream.stream_reply(text_stream("late"), hang=30)  # cut before the reply began: the SDK saw nothing
    with pytest.raises(anthropic.APITimeoutError):
        client.with_options(timeout=0.5).messages.create(model="dear", max_tokens=50, stream=True,
                                                         messages=[{"role": "user", "content": "Hi"}])  # fmt: skip
    upstream.json_reply({"error": {"message": "boom"}}, status=500)
    with pytest.raises(anthropic.APIStatusError):
        ask(url, made["key"], model="dear")  # nothing served: nothing spent
    wait_recorded(server, 9)  # the cut streams settled too
    budget = retrieve(url, made["id"])["budget"]
    assert Decimal(budget["used"]) == expected and budget["amount"] == "100000" and budget["currency"] == "USD"
    today = datetime.datetime.now(datetime.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    report: Any = admin(url).get("/v1/organizations/cost_report", cast_to=object, options={"params": {
        "starting_at": today.isoformat(), "group_by": ["description"]}})  # fmt: skip
    results = report["data"][0]["results"]
    assert sum(Decimal(r["amount"]) for r in results) == expected
    assert {r["model"] for r in results if Decimal(r["amount"])} == {"cheap", "dear", "native"}
    assert all(r["currency"] == "USD" and r["description"].startswith(r["model"]) for r in results)
    assert all(set(r) == COST_FIELDS for r in results) and {"data", "has_more", "next_page"} == set(report)
    by_key: Any = admin(url).get("/v1/organizations/cost_report", cast_to=object, options={"params": {
        "starting_at": today.isoformat(), "group_by": ["api_key_id", "workspace_id"]}})  # fmt: skip
    assert [(r["api_key_id"], r["workspace_id"], Decimal(r["amount"])) for r in by_key["data"][0]["results"]] == [
        (made["id"], None, expected)]  # fmt: skip
    # What the budget enforces is the same sum: a budget of exactly it is spent, one a nano-dollar more is not.
    update(url, made["id"], budget={"amount": str(expected), "period": "day"})
    with pytest.raises(anthropic.RateLimitError, match="budget"):
        ask(url, made["key"], model="cheap")
    update(url, made["id"], budget={"amount": str(expected + Decimal("0.0000001")), "period": "day"})
    upstream.json_reply(completion("admitted"))
    assert ask(url, made["key"], model="cheap").content[0].text == "admitted"


def test_a_spent_budget_is_a_429_not_retried_naming_the_budget_and_its_reset(url: str, upstream: FakeUpstream) -> None:
    made = create(url, name="thrifty", budget={"amount": "0.01", "period": "week"})  # a hundredth of a cent
    upstream.json_reply(completion("a", prompt=10, completion_tokens=5))
    ask(url, made["key"], model="dear")  # admitted with nothing spent; it costs 0.0105 cents
    with pytest.raises(anthropic.RateLimitError) as refused:
        ask(url, made["key"], model="dear")
    assert refused.value.response.headers["x-should-retry"] == "false"
    message = refused.value.body["error"]["message"]  # type: ignore[index]
    assert "budget" in message and "0.01 cents" in message and "per week" in message and "resets at" in message
    with pytest.raises(anthropic.RateLimitError, match="budget"):  # priced by its wildcard alias
        ask(url, made["key"], model="claude-by-any-name")
    with pytest.raises(anthropic.RateLimitError, match="budget"):  # priced as the default model that serves it
        ask(url, made["key"], model="no-such-model")
    upstream.json_reply(completion("free"))
    assert ask(url, made["key"], model="free").content[0].text == "free"  # no price: no budget counts it


def test_with_redis_a_budget_spent_through_one_gateway_is_spent_on_every_one(
    upstream: FakeUpstream, gateway_from: Any, tmp_path: Any, redis_url: str, redis_prefix: str
) -> None:
    models = [{"name": "dear", "upstream": "default", "upstream_model": "test-model", "price": PRICES["dear"]}]
    shared = {"usage": {"dir": str(tmp_path)}, "models": models,  # one key store (the SQLite file), one Redis
              "limits": {"redis_url": redis_url, "redis_prefix": redis_prefix}}  # fmt: skip
    one, two = (gateway_from(keys_config(upstream.url, **shared)) for _ in range(2))
    made = create(one.url, name="both", budget={"amount": "0.01", "period": "day"})
    upstream.json_reply(completion("a", prompt=10, completion_tokens=5))
    ask(one.url, made["key"], model="dear")  # 0.0105 cents: the budget is spent

    eventually(lambda: made["id"] in two.app.state.gateway.keyring.by_id, "the key known to the second gateway")
    with pytest.raises(anthropic.RateLimitError, match="budget"):
        ask(two.url, made["key"], model="dear")  # its own first request: refused by what one spent


def test_unpriced_models_are_named_once_a_key_has_a_budget(url: str, caplog: pytest.LogCaptureFixture) -> None:
    create(url, name="plain")
    assert "no budget counts" not in caplog.text
    create(url, name="budgeted", budget={"amount": "100"})
    create(url, name="another", budget={"amount": "100"})
    assert caplog.text.count("no budget counts free") == 1
