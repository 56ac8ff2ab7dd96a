"""Secrets never reach log output, wherever they hide in an event."""

from __future__ import annotations

import io
import json

import structlog

from sparkctl import log

TOKEN = "hf_SuperSecretToken123"


def test_token_is_redacted_everywhere() -> None:
    out = io.StringIO()
    log.configure(secrets=[TOKEN], json=True, stream=out)
    logger = structlog.get_logger()
    logger.info("download_started", url=f"https://x/?token={TOKEN}", headers={"Authorization": f"Bearer {TOKEN}"},
                args=["--token", TOKEN])
    try:
        raise RuntimeError(f"401 for token {TOKEN}")
    except RuntimeError:
        logger.exception("download_failed")
    logger.warning(f"message itself has {TOKEN}")
    text = out.getvalue()
    assert TOKEN not in text
    events = [json.loads(line) for line in text.splitlines()]
    assert [e["event"] for e in events][:2] == ["download_started", "download_failed"]
    assert log.MASK in events[0]["headers"]["Authorization"]
    assert "RuntimeError" in events[1]["exception"]


def test_console_renderer_redacts_too() -> None:
    out = io.StringIO()
    log.configure(secrets=[TOKEN], json=False, stream=out)
    structlog.get_logger().info("x", token=TOKEN)
    assert TOKEN not in out.getvalue() and "x" in out.getvalue()


def test_settings_token_reaches_the_redactor(monkeypatch) -> None:
    from sparkctl.settings import Settings

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert Settings().secrets() == [TOKEN]
    assert TOKEN not in repr(Settings()) and TOKEN not in json.dumps(Settings().masked())


def test_escaped_forms_of_a_secret_are_masked_too() -> None:
    from sparkctl.log import MASK, Redactor

    secret = 'hf_abc"def\\ghi'
    line = f"Invalid header value {('Bearer ' + secret)!r}; json: {json.dumps(secret)}; plain {secret}"
    scrubbed = Redactor([secret]).scrub(line)
    assert "abc" not in scrubbed and scrubbed.count(MASK) == 3
