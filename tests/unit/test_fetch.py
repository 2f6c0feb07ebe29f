import pytest

from dragoman.backends.fetch import _public, has_url_documents


@pytest.mark.parametrize(
    ("address", "public"),
    [("8.8.8.8", True), ("2606:4700:4700::1111", True), ("127.0.0.1", False), ("10.1.2.3", False), ("192.168.0.1", False),
     ("172.16.5.4", False), ("169.254.169.254", False), ("::1", False), ("fd00::1", False), ("224.0.0.1", False), ("0.0.0.0", False)],
)  # fmt: skip
def test_only_public_addresses_are_fetched(address, public):
    assert _public(address) is public


def test_the_cheap_precheck():
    assert has_url_documents(b'{"type":"document","source":{"type":"url","url":"https://x"}}')
    assert not has_url_documents(b'{"type":"text","text":"a url"}')
