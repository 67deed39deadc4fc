"""docs/configuration.md is generated from GatewayConfig and the CLI; it must match them."""

from __future__ import annotations

from dataclasses import fields

import pytest

from gateway.config import GatewayConfig
from scripts import config_reference


def test_configuration_page_matches_the_code() -> None:
    written = config_reference.TARGET.read_text(encoding="utf-8")
    assert written == config_reference.render(), (
        "docs/configuration.md is out of date with gateway/config.py or the foldgate CLI: "
        f"run `PYTHONPATH=$PWD .venv/bin/python -m {config_reference.__name__}` and commit it"
    )


def test_every_field_has_a_description() -> None:
    docs = config_reference.field_docs()
    missing = [f.name for f in fields(GatewayConfig) if not docs.get(f.name)]
    assert not missing, f"GatewayConfig fields without a docstring: {missing}"


def test_serve_flags_that_set_a_field_are_found() -> None:
    flags = config_reference.serve_flags()
    assert flags["store_url"] == "--store URL"
    assert flags["replicas"] == "--replica URL"
    assert flags["ui"] == "--ui"
    assert "k" not in flags  # no flag: file or environment only


@pytest.mark.parametrize(
    ("type_name", "raw", "expected"),
    [
        ("tuple[str, ...]", "http://a:1,http://b:2", ("http://a:1", "http://b:2")),
        (
            "dict[str, str]",
            "sha256:aa=acme,sha256:bb=beta",
            {"sha256:aa": "acme", "sha256:bb": "beta"},
        ),
        ("dict[str, dict[str, Any]]", '{"acme": {"budget": 100}}', {"acme": {"budget": 100}}),
        ("bool", "yes", True),
    ],
)
def test_documented_environment_formats_load(
    monkeypatch: pytest.MonkeyPatch, type_name: str, raw: str, expected: object
) -> None:
    # The page spells each of these types' FOLDGATE_<FIELD> values one way: that way loads.
    assert type_name in config_reference.ENV_FORMATS
    names = [f.name for f in fields(GatewayConfig) if str(f.type) == type_name]
    assert names
    for name in names:
        monkeypatch.setenv(f"FOLDGATE_{name.upper()}", raw)
    config = GatewayConfig.load()
    for name in names:
        assert getattr(config, name) == expected
