from tests.support.fakes import completion, text_stream


def test_plain_text(client, upstream):
    upstream.json_reply(completion("Hi there", prompt=12, completion_tokens=3))
    message = client.messages.create(model="test-model", max_tokens=50, messages=[{"role": "user", "content": "Hello"}])
    assert message.content[0].text == "Hi there"
    assert message.usage.input_tokens == 12
    assert message.usage.output_tokens == 3
    assert message.stop_reason == "end_turn"
    assert upstream.requests[0]["messages"] == [{"role": "user", "content": "Hello"}]


def test_stream(client, upstream):
    upstream.stream_reply(text_stream("Hel", "lo", " world"))
    with client.messages.stream(
        model="test-model", max_tokens=50, messages=[{"role": "user", "content": "Hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hello world"
    assert final.content[0].text == "Hello world"
    assert final.stop_reason == "end_turn"
