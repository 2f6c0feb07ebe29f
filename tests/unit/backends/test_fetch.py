import pytest

from dragoman.backends.fetch import _checked, _public, has_url_documents
from dragoman.core.errors import InvalidRequest


@pytest.mark.parametrize(
    ("address", "public"),
    [("8.8.8.8", True), ("2606:4700:4700::1111", True), ("127.0.0.1", False), ("10.1.2.3", False), ("192.168.0.1", False),
     ("172.16.5.4", False), ("169.254.169.254", False), ("::1", False), ("fd00::1", False), ("224.0.0.1", False), ("0.0.0.0", False),
     # Python 3.11 before .10 calls these global (CVE-2024-4032); IPv4 inside IPv6 is checked as IPv4
     ("192.0.0.192", False), ("::127.0.0.1", False), ("::ffff:169.254.169.254", False), ("64:ff9b::a9fe:a9fe", False),
     ("64:ff9b::808:808", True), ("2002:7f00:1::", False), ("fec0::1", False)],
)  # fmt: skip
def test_only_public_addresses_are_fetched(address, public):
    assert _public(address) is public


@pytest.mark.parametrize("host", ["\uff11\uff12\uff17.0.0.1", "127\u30020\u30020\u30021", "\u2460\u2461\u2466.0.0.1"])
def test_a_host_that_normalises_to_a_private_address_is_refused(host):
    # yarl (aiohttp's parser) reads these as 127.0.0.1 and connects without resolving them
    with pytest.raises(InvalidRequest, match="private, loopback or reserved"):
        _checked(f"http://{host}:8080/doc.txt", allow_private=False)


def test_the_cheap_precheck():
    assert has_url_documents(b'{"type":"document","source":{"type":"url","url":"https://x"}}')
    assert not has_url_documents(b'{"type":"text","text":"a url"}')
