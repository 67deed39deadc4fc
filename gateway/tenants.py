"""Tenants: API keys stored as hashes, per-tenant settings, and what a tenant sends upstream.

A tenant is whoever holds one of its API keys. The config keeps only ``sha256:<hex>`` of
each key (``foldgate keys create`` makes a key and prints its line): keys are 256-bit
random tokens, so a plain SHA-256 cannot be reversed and a lookup by hash needs no
constant-time compare.

Every upstream request carries vLLM's ``cache_salt`` for its tenant, so a replica's prefix
cache is shared only within a tenant: otherwise one tenant could time another's cached
prefixes. The salt is an HMAC of the length-prefixed tenant id under a server secret, so
no client can guess or pick another tenant's salt, and two tenant ids never share one.

vLLM's request fields beyond OpenAI's, as a client may send them (``check_request_fields``,
before anything is stored; ``scope_upstream_body`` as the upstream body is built):

- sampling and output fields (``top_k``, ``min_tokens``, ``ignore_eos``, ``logprobs``,
  ``structured_outputs``, ``chat_template_kwargs``...) pass: they shape the answer the
  client asked for and nothing the gateway relies on; ``chat_template_kwargs`` without
  the keys that are the template renderer's own arguments or the tokenizer's special
  tokens (``TEMPLATE_ARGUMENTS``), which would replace what the gateway rendered;
- the gateway's own (``cache_salt``: the tenant's salt instead; ``session_id``: vLLM tags
  its KV events and encoder-cache keys with it, shared by every tenant of a replica) and
  the guarded ones (``GUARDED_FIELDS``: scheduling and KV transfer, nothing in the reply)
  are dropped, the guarded ones only where the tenant's ``upstream_fields`` do not list
  them: leaving them out changes no reply;
- fields that change what the replica renders from the gateway's context or how the
  reply relates to it are refused with a 400 naming them (``REFUSED_FIELDS``, each with
  why), since dropping them would answer another request than the one asked: some the
  tenant's ``upstream_fields`` may allow, the others break the gateway's own rendering,
  restores or stored history whoever sends them. A value that means what leaving the
  field out means (``add_generation_prompt: true``, as SDK model dumps send it) passes.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, fields
from typing import Any

from gateway.dialects.errors import DialectError
from gateway.dialects.fields import check_fields, integer
from gateway.fold import STRATEGIES, StrategySpec, parse_spec
from router import POLICY_NAMES

KEY_HASH_PREFIX = "sha256:"
_KEY_HASH = re.compile(r"sha256:[0-9a-f]{64}")
_SALT_CONTEXT = b"foldgate cache_salt v1\x00"
# vLLM request fields that schedule requests or move KV and encoder-cache blocks: a
# tenant sends them only when its settings allow (``upstream_fields``); else dropped.
GUARDED_FIELDS = frozenset({"priority", "kv_transfer_params", "ec_transfer_params"})
# A tenant's priority, configured or sent by its clients: the gateway sends it times its
# classes plus one (``gateway.steps.priority``), which must fit vLLM's (and orjson's) int64.
PRIORITY_RANGE = (-(2**62), 2**62 - 1)
CACHE_SALT = "cache_salt"
# The gateway's own, always dropped from a client's body (``cache_salt`` set after).
GATEWAY_FIELDS = frozenset({CACHE_SALT, "session_id"})
_ABSENT = object()


@dataclass(frozen=True, slots=True)
class Refused:
    """Why a vLLM field is refused; ``allowable``: a tenant's ``upstream_fields`` may let
    it through; ``neutral``: the value that means what leaving it out means."""

    why: str
    allowable: bool = False
    neutral: Any = _ABSENT

    def changes(self, value: Any) -> bool:
        """Whether ``value`` asks for something leaving the field out does not (null is
        absent; ``1`` is not ``true``)."""
        same = type(value) is type(self.neutral) and value == self.neutral
        return value is not None and not same


_UNSEEN = "the gateway's token budget, folding and stored history would not see it"
_TAIL = "the gateway's restores add turns after the client's last message"
_RENDERED = "it would describe the prompt the gateway rendered, not the one the client sent"
REFUSED_FIELDS = {
    "chat_template": Refused("it replaces the template the replica renders with", True),
    "documents": Refused(f"the template renders them into the prompt; {_UNSEEN}", True),
    "add_special_tokens": Refused(f"it adds tokens to the prompt; {_UNSEEN}", True, False),
    "mm_processor_kwargs": Refused("it sets how the replica processes media", True),
    "media_io_kwargs": Refused("it sets how the replica loads media", True),
    "vllm_xargs": Refused("vLLM extensions' arguments mean nothing the gateway knows", True),
    "request_id": Refused(
        "the gateway names its upstream requests: one request can be several "
        "(failover, restores, a context too long)"
    ),
    "add_generation_prompt": Refused(f"{_TAIL}, to be answered", neutral=True),
    "continue_final_message": Refused(f"{_TAIL}: there is no final message", neutral=False),
    "echo": Refused(
        "the reply would start with the prompt's last message, stored as the assistant's",
        neutral=False,
    ),
    "truncate_prompt_tokens": Refused(
        "the replica would cut the rendered context; what is kept is the strategy's choice"
    ),
    "truncation_side": Refused("the replica would cut the rendered context"),
    "prompt_logprobs": Refused(_RENDERED),
    "return_token_ids": Refused(_RENDERED, neutral=False),
    "return_prompt_text": Refused(_RENDERED, neutral=False),
}
ALLOWABLE_FIELDS = GUARDED_FIELDS | {n for n, r in REFUSED_FIELDS.items() if r.allowable}
# ``chat_template_kwargs`` keys that are the template renderer's own arguments or the
# tokenizer's special tokens: set by a client, they replace what the gateway rendered.
TEMPLATE_ARGUMENTS = frozenset(
    {
        "messages", "conversation", "tools", "documents", "chat_template", "tokenize",
        "add_generation_prompt", "continue_final_message", "return_dict",
        "return_assistant_tokens_mask", "tokenizer_kwargs", "bos_token", "eos_token",
        "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
        "additional_special_tokens",
    }
)  # fmt: skip
ANY_TENANT = "*"

log = logging.getLogger("foldgate")


def hash_key(key: str) -> str:
    """The line an API key is stored as."""
    return KEY_HASH_PREFIX + hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    """A fresh API key: 256 random bits."""
    return "fg-" + secrets.token_urlsafe(32)


def check_key_hashes(api_keys: Mapping[str, str]) -> None:
    """Refuse a key table that holds anything but key hashes (a plain key by mistake)."""
    for stored, tenant in api_keys.items():
        if not _KEY_HASH.fullmatch(stored):
            raise ValueError(
                f"api_keys holds key hashes ('sha256:<64 hex>'), not keys: the entry for "
                f"tenant {tenant!r} is not one; `foldgate keys hash` prints a key's line"
            )
        if not isinstance(tenant, str) or not tenant:
            raise ValueError(f"api_keys: tenant of {stored} must be a non-empty string")


@dataclass(frozen=True)
class TenantSettings:
    """One tenant's defaults and limits (config ``[tenants.<id>]``, ``[tenants."*"]`` for
    every tenant without its own table). None: the gateway's default, or no limit."""

    strategy: StrategySpec | None = None
    budget: int | None = None
    """Token budget of the cliff strategies; set, it replaces the context guard's."""
    policy: str | None = None
    """Routing policy of the tenant's sessions (``sticky``, ``round_robin``, ...)."""
    upstream_fields: frozenset[str] = frozenset()
    """vLLM fields this tenant may send that others may not (``ALLOWABLE_FIELDS``)."""
    requests_per_minute: int | None = None
    raw_tokens_per_minute: int | None = None
    """Prompt tokens as the harness sent them (the gateway's estimate), per minute."""
    upstream_tokens_per_minute: int | None = None
    """Prompt tokens the replicas reported, per minute (known after each reply)."""
    concurrent_requests: int | None = None
    sessions: int | None = None
    """Live sessions (used within the store's TTL)."""
    session_bytes: int | None = None
    """Stored history bytes per session (a smaller cap than the store's)."""
    priority: int | None = None
    """The tenant's vLLM priority with ``upstream_priority`` on (lower runs first; an
    integer in ``PRIORITY_RANGE``; ``gateway.steps.priority``)."""

    @classmethod
    def parse(cls, tenant: str, raw: Mapping[str, Any]) -> TenantSettings:
        known = {f.name for f in fields(cls)}
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"tenants.{tenant}: unknown keys {', '.join(sorted(unknown))}")
        values = dict(raw)
        strategy = values.get("strategy")
        if strategy is not None:
            try:
                values["strategy"] = parse_spec(strategy)
            except ValueError as exc:
                raise ValueError(
                    f"tenants.{tenant}.strategy: {strategy!r} is not one of "
                    f"{', '.join(STRATEGIES)} or a composition of them ('refold+cliff'): {exc}"
                ) from None
        policy = values.get("policy")
        if policy is not None and policy not in POLICY_NAMES:
            raise ValueError(
                f"tenants.{tenant}.policy: {policy!r} is not one of {', '.join(POLICY_NAMES)}"
            )
        priority = values.get("priority")
        if priority is not None and (
            not isinstance(priority, int)
            or isinstance(priority, bool)
            or not PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]
        ):
            raise ValueError(
                f"tenants.{tenant}.priority must be an integer between {PRIORITY_RANGE[0]} "
                f"and {PRIORITY_RANGE[1]}"
            )
        for name in known - {"strategy", "policy", "upstream_fields", "priority"}:
            value = values.get(name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                raise ValueError(f"tenants.{tenant}.{name} must be a positive integer")
        allowed = values.get("upstream_fields", ())
        if isinstance(allowed, str) or not set(allowed) <= ALLOWABLE_FIELDS:
            raise ValueError(
                f"tenants.{tenant}.upstream_fields: a list of {', '.join(sorted(ALLOWABLE_FIELDS))}"
            )
        values["upstream_fields"] = frozenset(allowed)
        return cls(**values)


def parse_tenants(
    table: Mapping[str, Mapping[str, Any]],
) -> tuple[dict[str, TenantSettings], TenantSettings]:
    """The config's ``tenants`` table: each tenant's own settings, and those of every
    tenant without a table of its own (``"*"``)."""
    settings = {t: TenantSettings.parse(t, raw) for t, raw in table.items()}
    return settings, settings.pop(ANY_TENANT, TenantSettings())


def routing_policies(
    table: Mapping[str, Mapping[str, Any]], default: str
) -> tuple[str, dict[str, str]]:
    """The routing policy of tenants without a table of their own (``"*"``'s, else
    ``default``), and each tenant's whose policy differs from that one."""
    own, anyone = parse_tenants(table)
    fallback = anyone.policy or default
    chosen = {tenant: settings.policy or default for tenant, settings in own.items()}
    return fallback, {tenant: name for tenant, name in chosen.items() if name != fallback}


class Tenants:
    """Settings by tenant, and each tenant's cache salt.

    ``salt_secret`` None: no salts (a gateway without API keys has one tenant, nothing to
    keep apart); client-sent salts are dropped all the same.
    """

    def __init__(self, table: Mapping[str, Mapping[str, Any]], salt_secret: bytes | None) -> None:
        self._settings, self._default = parse_tenants(table)
        self._secret = salt_secret
        self._salts: dict[str, str] = {}

    def settings(self, tenant: str) -> TenantSettings:
        return self._settings.get(tenant, self._default)

    def cache_salt(self, tenant: str) -> str | None:
        if self._secret is None:
            return None
        salt = self._salts.get(tenant)
        if salt is None:
            name = tenant.encode()
            message = _SALT_CONTEXT + len(name).to_bytes(8, "big") + name
            salt = hmac.new(self._secret, message, hashlib.sha256).hexdigest()
            self._salts[tenant] = salt
        return salt

    def check_request_fields(self, tenant: str, body: Mapping[str, Any]) -> None:
        """Refuse (400 naming it) a vLLM field in a client's body that ``REFUSED_FIELDS``
        lists and the tenant's ``upstream_fields`` do not allow, unless its value means
        what leaving it out means (null: absent), template arguments in
        ``chat_template_kwargs``, and an allowed ``priority`` that is no integer in
        ``PRIORITY_RANGE``."""
        allowed = self.settings(tenant).upstream_fields
        for name in sorted(REFUSED_FIELDS.keys() & body.keys() - allowed):
            if REFUSED_FIELDS[name].changes(body[name]):
                raise DialectError(
                    f"{name} is not accepted: {REFUSED_FIELDS[name].why}", param=name
                )
        if "priority" in allowed:  # the gateway reads it, and sends it scaled
            check_fields(body, {"priority": integer(*PRIORITY_RANGE)})
        kwargs = body.get("chat_template_kwargs")
        arguments = (
            sorted(TEMPLATE_ARGUMENTS.intersection(kwargs)) if isinstance(kwargs, Mapping) else []
        )
        if arguments:
            raise DialectError(
                f"{arguments[0]!r} is an argument of the template renderer, set by the gateway",
                param=f"chat_template_kwargs.{arguments[0]}",
            )

    def scope_upstream_body(self, tenant: str, body: MutableMapping[str, Any]) -> None:
        """Set the tenant's cache salt (replacing any the client sent), drop the gateway's
        own fields and the guarded ones the tenant may not send; vLLM's sampling
        extensions pass as they came (the refused ones never got this far)."""
        allowed = self.settings(tenant).upstream_fields
        for name in GATEWAY_FIELDS | (GUARDED_FIELDS - allowed):
            body.pop(name, None)
        salt = self.cache_salt(tenant)
        if salt is not None:
            body[CACHE_SALT] = salt


def salt_secret(configured: str | None, keys_configured: bool) -> bytes | None:
    """The server secret for cache salts: the configured one; with API keys but none
    configured, a random one for this process (logged: processes then salt differently)."""
    if configured:
        return configured.encode()
    if not keys_configured:
        return None
    log.warning(
        "cache_salt_secret is not set: this process salts tenants' prefix caches with a "
        "random secret of its own; set it (FOLDGATE_CACHE_SALT_SECRET) so that every "
        "gateway process of the deployment shares cached prefixes"
    )
    return secrets.token_bytes(32)
