import json
from dataclasses import dataclass
from typing import Any

import pytest

from gateway.fold import make_renderer
from gateway.fold.renderer import Rendered, Renderer, RenderState, RenderStats
from gateway.tokens import GENERATION_PROMPT, ChatTokenizer, TokenCounter, serialize_message
from gateway.transcript import Message, Text, ToolCall, Transcript, text_message, tool_message
from offline.replay import (
    GIB,
    ReplayConfig,
    carries_fold_lines,
    replay,
    requests_of,
)
from offline.replay_explain import explain_request


class CharCounter(TokenCounter):
    """One token per character: prompt sizes are string lengths, computable by hand."""

    name = "chars"

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]


class LastTwo(Renderer):
    """Keeps only the newest two messages once there are more than two: rewrites the prefix."""

    name = "last2"

    def render(self, history: Transcript, state: RenderState | None = None, cache: Any = None):
        msgs = history.messages
        if len(msgs) <= 2:
            return Rendered(transcript=history, cache=cache)
        stats = RenderStats(compactions=len(msgs) // 2 - 1)  # cumulative, as cliff counts
        return Rendered(history.with_messages(msgs[-2:]), cache, stats)


class ResettingCounter(Renderer):
    """Reports a cumulative compaction count 1, 2, then 1 again (its cache restarted)."""

    name = "resets"

    def render(self, history: Transcript, state: RenderState | None = None, cache: Any = None):
        n = cache or 0
        return Rendered(history, n + 1, RenderStats(compactions=(1, 2, 1)[n]))


def factory(spec: str, **kwargs: Any) -> Renderer:
    own = {"last2": LastTwo, "resets": ResettingCounter}
    return own[spec]() if spec in own else make_renderer(spec, **kwargs)


@dataclass
class Traj:
    id: str
    harness: str
    transcript: Transcript
    compaction_indices: tuple[int, ...] = ()


def call(cid: str, cmd: str) -> Message:
    return Message(role="assistant", parts=(Text("run"), ToolCall(cid, "bash", f'{{"c":"{cmd}"}}')))


MSGS = (
    text_message("system", "You are a coder."),
    text_message("user", "Fix the bug."),
    call("c1", "ls"),
    tool_message("c1", "a.py"),
    call("c2", "cat a.py"),
    tool_message("c2", "x = 1"),
    text_message("assistant", "Done."),
)
TRAJ = Traj("t1", "test", Transcript(messages=MSGS))


def run_replay(cfg: ReplayConfig):
    chat = ChatTokenizer(CharCounter())
    return replay([TRAJ], chat, cfg, factory)


def size(msgs: tuple[Message, ...]) -> int:
    return sum(len(serialize_message(m)) for m in msgs) + len(GENERATION_PROMPT)


def test_requests_are_the_prefixes_before_each_reply() -> None:
    reqs = list(requests_of(TRAJ.transcript))
    assert [len(r.messages) for r in reqs] == [2, 4, 6]
    assert reqs[1].messages == MSGS[:4]


def test_requests_after_a_harness_compaction_start_at_its_summary() -> None:
    summary = text_message("user", "Summary of the earlier work.")
    history = Transcript(messages=(*MSGS[:4], summary, *MSGS[4:]))
    reqs = list(requests_of(history, compaction_indices=(4,)))
    assert [len(r.messages) for r in reqs] == [2, 2, 4]
    assert reqs[1].messages == (MSGS[0], summary)  # system prompt kept, old turns gone
    assert reqs[2].messages == (MSGS[0], summary, *MSGS[4:6])


def test_base_replay_numbers_by_hand() -> None:
    cfg = ReplayConfig(strategies=("base",), block_size=1, kv_bytes_per_token=1024)
    result = run_replay(cfg)
    (run,) = result.runs
    p = [size(MSGS[:2]), size(MSGS[:4]), size(MSGS[:6])]
    assert run.context == p
    # each request extends the previous one, generation prompt included
    assert run.cached == [0, p[0], p[1]]
    assert run.rewrites == 0 and run.compactions == 0 and run.over_budget == 0
    t = result.totals["base"]
    assert t.prompt_tokens == sum(p)
    assert t.uncached_tokens == sum(p) - p[0] - p[1]
    assert t.hit_rate == pytest.approx((p[0] + p[1]) / sum(p))
    assert t.peak_context == p[2]
    assert t.mean_peak_kv_gib == pytest.approx(p[2] * 1024 / GIB)
    assert t.requests == 3 and t.sessions == 1


def test_block_size_rounds_hits_down_to_full_blocks() -> None:
    cfg = ReplayConfig(strategies=("base",), block_size=16)
    (run,) = run_replay(cfg).runs
    p0, p1 = size(MSGS[:2]), size(MSGS[:4])
    assert run.cached[1:] == [p0 // 16 * 16, p1 // 16 * 16]


def test_rewrites_budget_and_compactions_are_counted() -> None:
    budget = size(MSGS[:2]) + 1
    cfg = ReplayConfig(strategies=("base", "last2"), block_size=1, budget=budget)
    result = run_replay(cfg)
    base, last2 = result.runs
    assert base.over_budget == 2  # requests 2 and 3 exceed the budget
    assert last2.strategy == "last2"
    assert last2.context == [size(MSGS[:2]), size(MSGS[2:4]), size(MSGS[4:6])]
    assert last2.rewrites == 2 and last2.compactions == 2
    assert result.totals["last2"].prompt_tokens < result.totals["base"].prompt_tokens


def test_compaction_counter_restarts_are_added_up() -> None:
    (run,) = run_replay(ReplayConfig(strategies=("resets",))).runs
    assert run.compactions == 3


def test_fold_operator_is_off_for_recorded_replies_unless_forced() -> None:
    auto = run_replay(ReplayConfig(strategies=("base", "refold")))
    assert auto.fold_active == []
    note = auto.operators_note()
    assert "dedup: yes; harness folds (progress, superseded): yes" in note
    assert "protocol fold inactive: no PROGRESS/STALE lines" in note
    forced = run_replay(ReplayConfig(strategies=("base", "refold"), fold="on"))
    assert forced.fold_active == ["t1"]
    assert "fold on" in forced.operators_note()
    # fold on renders the fold prompt (and reminders) the recorded agent never saw
    assert forced.totals["refold"].prompt_tokens > auto.totals["refold"].prompt_tokens
    assert forced.totals["refold"].overhead_tokens > 0 == auto.totals["refold"].overhead_tokens
    # the gateway's default asks; the asks the recording ignores cost a little, once each
    asked = run_replay(ReplayConfig(strategies=("base", "refold"), fold="auto"))
    assert "fold auto" in asked.operators_note()
    assert 0 < asked.totals["refold"].overhead_tokens < forced.totals["refold"].overhead_tokens
    assert "n/a" in run_replay(ReplayConfig(strategies=("base",))).operators_note()


def test_fold_lines_detection() -> None:
    folding = text_message("assistant", "PROGRESS: read a.py\nSTALE: 0\nnext")
    assert carries_fold_lines(Transcript(messages=(folding,)))
    assert not carries_fold_lines(Transcript(messages=(text_message("user", "PROGRESS: x"),)))
    assert not carries_fold_lines(Transcript(messages=(text_message("assistant", "PROGRESS: x"),)))


def test_json_has_totals_and_series() -> None:
    cfg = ReplayConfig(strategies=("base",), block_size=1)
    out = run_replay(cfg).to_json()
    assert out["tokenizer"] == "chars"
    assert out["totals"]["base"]["requests"] == 3
    assert out["sessions"][0]["context"] == [size(MSGS[:2]), size(MSGS[:4]), size(MSGS[:6])]


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [
        ({"strategies": ()}, "at least one strategy"),
        ({"strategies": ("base", "base")}, "listed twice"),
        ({"strategies": ("base",), "k": 0}, "k must be"),
        ({"strategies": ("base",), "budget": 0}, "budget"),
        ({"strategies": ("base",), "fold": "maybe"}, "fold must be one of"),
    ],
)
def test_bad_config(kwargs: dict, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        ReplayConfig(**kwargs)


def harness_run() -> Traj:
    """A long test log, an output and a duplicate of it, the test run again, small steps."""
    big = "\n".join(f"line {i} of the test log, different on each line {i * 13}" for i in range(60))
    notes = "\n".join(f"note {i}: something the agent wrote down earlier {i}" for i in range(20))
    steps = [("make test", big), ("cat notes.txt", notes), ("cat notes.bak", notes)]
    steps += [("make test", "all passed")]
    steps += [(f"echo {n}", "ok") for n in range(30)]
    messages = [text_message("system", "You are a coder."), text_message("user", "Fix it.")]
    for i, (command, output) in enumerate(steps):
        arguments = json.dumps({"command": command})
        messages.append(Message("assistant", (Text("run"), ToolCall(f"c{i}", "bash", arguments))))
        messages.append(tool_message(f"c{i}", output))
    return Traj("h1", "claude-code", Transcript(messages=tuple(messages)))


def test_the_replay_reports_what_each_operator_removed_per_harness() -> None:
    chat = ChatTokenizer(CharCounter())
    result = replay([harness_run()], chat, ReplayConfig(strategies=("base", "refold")))
    refold = next(r for r in result.runs if r.strategy == "refold")
    assert refold.harness == "claude-code"
    assert refold.removed["dedup"] > 0 and refold.removed["superseded"] > 0
    prompt, removed = result.removed_by_harness()[("claude-code", "refold")]
    assert prompt == refold.prompt_tokens and removed == refold.removed
    assert result.to_json()["sessions"][1]["removed"] == refold.removed
    assert "superseded" in result.operators_note()


def test_explain_lists_what_one_request_did_not_send_as_is_and_why() -> None:
    chat = ChatTokenizer(CharCounter())
    renderer = make_renderer("refold", count_tokens=chat.message_count, fold="off")
    run = harness_run()
    changes = explain_request(run, renderer, 30, chat)
    assert changes is not None
    kinds = {c.kind for c in changes}
    assert kinds == {"stub", "fold"}
    stub = next(c for c in changes if c.kind == "stub")
    assert stub.why == ("[duplicate of step 1 (`cat notes.txt`): this entire output (20 lines)]",)
    fold = next(c for c in changes if c.kind == "fold")
    assert "superseded: `make test` ran again at step 3" in fold.why[0]
    assert all(c.tokens_after < c.tokens_before for c in changes)
    assert explain_request(run, renderer, 1_000, chat) is None
