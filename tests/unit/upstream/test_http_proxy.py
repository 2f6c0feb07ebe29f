from dragoman.upstream.client import _proxy_for


def test_configured_proxy_wins(monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://env-proxy:3128")
    assert _proxy_for("http://gpu-1:8000", "http://mine:8080") == "http://mine:8080"


def test_environment_proxy_and_no_proxy(monkeypatch):
    for name in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://env-proxy:3128")
    monkeypatch.setenv("NO_PROXY", "internal.example,127.0.0.1")
    assert _proxy_for("http://gpu-1:8000", None) == "http://env-proxy:3128"
    assert _proxy_for("http://models.internal.example:8000", None) is None
    assert _proxy_for("http://127.0.0.1:8000", None) is None
    assert _proxy_for("https://api.example.com", None) is None  # no HTTPS_PROXY set


def test_no_proxy_without_environment(monkeypatch):
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert _proxy_for("http://gpu-1:8000", None) is None
