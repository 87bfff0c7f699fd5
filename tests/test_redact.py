"""Secrets in messages (issue 21, finding 12): an endpoint URL that carries credentials
(userinfo, a key in its query) is never shown as given, in an error, the model's repr, a log
line or the trace."""

import logging

import pytest

from sandcell import Agent, OpenAIModel, Rules
from sandcell.agent.model.redact import redact_url, scrub
from tests.scripted_server import dead_url

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    "url,shown",
    [
        ("https://user:pass@host.example/v1", "https://***@host.example/v1"),
        ("https://tok3n@host.example:8443/v1", "https://***@host.example:8443/v1"),
        ("http://h/v1?api_key=s3cret&api-version=2024-06-01", "http://h/v1?api_key=***&api-version=2024-06-01"),
        ("http://h/v1?key=s3cret", "http://h/v1?key=***"),
        ("http://h/v1?token=s3cret&x", "http://h/v1?token=***&x"),
        ("http://h/v1?access_token=a%2Bb&sig=zz", "http://h/v1?access_token=***&sig=***"),
        ("http://[::1]:8000/v1", "http://[::1]:8000/v1"),
        ("https://api.openai.com/v1", "https://api.openai.com/v1"),
        ("http://h:notaport/v1", "***"),
    ],
)  # fmt: skip
def test_redact_url(url, shown):
    assert redact_url(url) == shown


def test_scrub_hides_the_credentials_quoted_any_way():
    url = "https://me:pa%24%24word@h.example/v1?api_key=K3Y-123"
    text = f"failed {url}; user me, password pa$$word, key K3Y-123"
    said = scrub(text, url)
    for secret in ("pa%24%24word", "pa$$word", "K3Y-123", "me:pa"):
        assert secret not in said
    assert "https://***@h.example/v1?api_key=***" in said


def test_an_unreachable_endpoint_with_credentials_in_its_url_says_so_without_them(tmp_path, caplog):
    """The real openai client against a closed loopback port: the error, the model's repr,
    the retry log lines and the trace name the endpoint without its credentials."""
    port_url = dead_url()  # http://127.0.0.1:PORT/v1
    url = port_url.replace("http://", "http://alice:hunter22@") + "?api_key=sk-SECRET99"
    model = OpenAIModel("m", base_url=url, api_key="k", retry_base_s=0.01)
    assert "hunter22" not in repr(model) and "sk-SECRET99" not in repr(model)
    agent = Agent(model, rules=Rules(), sandbox_start="on_demand", protocol="react")
    with caplog.at_level(logging.INFO, logger="sandcell"):
        result = agent.run("x", [], tmp_path)
    assert result.stop_reason == "model_error"
    assert "cannot reach the model endpoint http://***@127.0.0.1" in result.detail
    assert "api_key=***" in result.detail
    shown = result.detail + caplog.text + result.trace_path.read_text()
    assert "hunter22" not in shown and "sk-SECRET99" not in shown and "alice" not in shown
    assert "retry" in caplog.text  # the retries were logged, redacted
