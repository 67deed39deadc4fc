"""``foldgate keys``: make API keys and the hash lines the gateway's config holds."""

from __future__ import annotations

import sys

import click

from gateway.tenants import hash_key, new_key


def _print_lines(key_hash: str, tenant: str) -> None:
    click.echo(f'config.toml [api_keys]:   "{key_hash}" = "{tenant}"')
    click.echo(f"FOLDGATE_API_KEYS / Secret: {key_hash}={tenant}")


@click.group("keys")
def keys() -> None:
    """API keys: the gateway stores only their hashes (config, Kubernetes Secret)."""


@keys.command("create")
@click.option("--tenant", required=True, help="The tenant the key authenticates.")
def create(tenant: str) -> None:
    """Make a new key for TENANT; print it once, with its hash lines for the config."""
    key = new_key()
    click.echo(f"key (give it to the tenant; it is not stored): {key}")
    _print_lines(hash_key(key), tenant)


@keys.command("hash")
@click.option("--tenant", required=True, help="The tenant the key authenticates.")
@click.argument("key", required=False)
def hash_command(tenant: str, key: str | None) -> None:
    """Print the hash lines of an existing KEY (read from stdin when not given)."""
    key = key if key is not None else sys.stdin.readline().strip()
    if not key:
        raise click.UsageError("give the key as an argument or on stdin")
    _print_lines(hash_key(key), tenant)
