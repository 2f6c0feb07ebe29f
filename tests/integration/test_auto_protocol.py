"""`protocol = "auto"`: one probe decides between passthrough and translation."""

from __future__ import annotations

import socket
import subprocess
import sys

import anthropic
import pytest

from dragoman.core.config_load import from_dict
from tests.support.fakes import completion
from tests.support.servers import GatewayServer
from tests.support.waiting import eventually


def _auto(url: str) -> GatewayServer:
    config = from_dict({"server": {"default_model": "m"}, "upstreams": {"up": {"url": url, "protocol": "auto", "max_retries": 0}},
                        "models": [{"name": "m", "upstream": "up", "upstream_model": "test-model"}]})  # fmt: skip
    return GatewayServer(config).start()


def test_an_openai_only_server_is_translated(upstream):
    gateway = _auto(upstream.url)  # .../v1
    try:
        upstream.json_reply(completion("translated"))
        client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
        message = client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
        assert message.content[0].text == "translated"
        assert upstream.requests[-1]["messages"] == [{"role": "user", "content": "hi"}]
        assert gateway.app.gateway.backends["up"].path == "translate"
    finally:
        gateway.stop()


def test_a_server_with_v1_messages_is_passed_through(native):
    gateway = _auto(native.url)  # no /v1
    try:
        client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
        message = client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
        assert message.content[0].text == "Hi"
        paths = [path for path, _, _ in native.requests]
        assert paths[-1] == "/v1/messages" and native.requests[-1][1]["model"] == "test-model"
        assert gateway.app.gateway.backends["up"].path == "passthrough"
    finally:
        gateway.stop()


def test_dragoman_check_shows_the_chosen_path(tmp_path, upstream, native):
    config = tmp_path / "dragoman.toml"
    config.write_text(
        f'[upstreams.openai_only]\nurl = "{upstream.url}"\nprotocol = "auto"\n'
        f'[upstreams.native]\nurl = "{native.url}"\nprotocol = "auto"\n'
        '[upstreams.down]\nurl = "http://127.0.0.1:9/v1"\nmax_retries = 0\n'
    )
    result = subprocess.run(
        [sys.executable, "-m", "dragoman", "check", "--config", str(config)], capture_output=True, text=True, timeout=60
    )
    lines = {line.split("\t")[0]: line for line in result.stdout.splitlines()}
    assert "path=translate" in lines["openai_only"] and "server=vllm" in lines["openai_only"]
    assert "path=passthrough" in lines["native"]
    assert "unreachable" in lines["down"]
    assert result.returncode == 1  # one upstream could not be reached


@pytest.mark.parametrize("ambiguous", ["401", "500-html"])
def test_an_ambiguous_probe_answer_decides_nothing_and_is_asked_again(native, ambiguous):
    from tests.support.fake_anthropic import NativeReply

    for _ in range(2):  # the startup probe, then the first request's
        if ambiguous == "401":
            native.replies.append(NativeReply(status=401, body={"error": "bad key"}))
        else:  # a proxy's error page in front of the server
            native.replies.append(
                NativeReply(
                    status=500, body=b"<html>Internal Server Error</html>", headers={"content-type": "text/html"}
                )
            )
    gateway = _auto(native.url)
    try:
        eventually(lambda: native.requests, "the start-up probe")
        client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as caught:
            client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
        assert "cannot tell its protocol" in caught.value.body["error"]["message"]
        assert ("answered 500 (not JSON)" if ambiguous == "500-html" else "answered 401") in caught.value.body["error"][
            "message"
        ]
        message = client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
        assert message.content[0].text == "Hi"
        assert gateway.app.gateway.backends["up"].path == "passthrough"
    finally:
        gateway.stop()


@pytest.mark.parametrize("healthy", ["native", "openai"])
def test_a_replica_that_never_answers_holds_neither_the_probe_nor_the_requests(native, upstream, healthy):
    from dragoman.assembly.gateway import Timings
    from dragoman.upstream.replicas import CoolDowns

    # Passed over for the whole test, not the 30 s it is in production: on a loaded machine the
    # three requests may take longer than that, and one sent to the hung instance after the
    # window waits for it (as it should: the test is about the probe and the requests behind it).
    passed_over = Timings(cool_downs=CoolDowns(silent=600.0))
    with socket.socket() as hung:  # connections are accepted (by the kernel), never answered
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)
        up = {"url": f"http://127.0.0.1:{hung.getsockname()[1]}", "replicas": [native.url if healthy == "native" else upstream.url],
              "protocol": "auto", "max_retries": 0, "first_byte_timeout": 600}  # fmt: skip
        config = from_dict({"server": {"default_model": "m"}, "upstreams": {"up": up},
                            "models": [{"name": "m", "upstream": "up", "upstream_model": "test-model"}]})  # fmt: skip
        gateway = GatewayServer(config, timings=passed_over).start()  # the probe asks the hung instance first
        try:
            client = anthropic.Anthropic(
                base_url=gateway.url, api_key="k", max_retries=0, timeout=8
            )  # below PROBE_TIMEOUT, far below first_byte_timeout
            for _ in range(3):  # the hung instance is passed over for a while after the probe found it silent
                message = client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
                assert message.content[0].text == ("Hi" if healthy == "native" else "Hello!")
            assert gateway.app.gateway.backends["up"].path == ("passthrough" if healthy == "native" else "translate")
        finally:
            gateway.stop()


def test_a_probe_no_instance_answers_fails_in_its_own_time_and_decides_nothing(monkeypatch):
    from dragoman.backends import auto

    monkeypatch.setattr(auto, "PROBE_TIMEOUT", 0.3)
    with socket.socket() as hung:  # connections are accepted (by the kernel), never answered
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)
        config = from_dict({"server": {"default_model": "m"}, "upstreams": {"up": {"url": f"http://127.0.0.1:{hung.getsockname()[1]}",
                            "protocol": "auto", "max_retries": 0, "first_byte_timeout": 600}},
                            "models": [{"name": "m", "upstream": "up", "upstream_model": "test-model"}]})  # fmt: skip
        gateway = GatewayServer(config).start()
        try:
            client = anthropic.Anthropic(
                base_url=gateway.url, api_key="k", max_retries=0, timeout=5
            )  # far below first_byte_timeout
            with pytest.raises(anthropic.APIStatusError) as caught:
                client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
            assert caught.value.status_code == 504
            assert "no instance answered the protocol probe within 0.3 s" in caught.value.body["error"]["message"]
            assert gateway.app.gateway.backends["up"].path == "undecided"  # the next request probes again
        finally:
            gateway.stop()
