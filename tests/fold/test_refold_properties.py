"""Properties of ReFold over generated histories: reversibility, determinism, pairing,
the prefix property between boundary moves, and cache/no-cache equality."""

from __future__ import annotations

import bisect
import itertools
import json
import random
import re
from collections import Counter
from dataclasses import dataclass, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.fold.dedup import MIN_RUN_LINES
from gateway.fold.protocol import reminder_text
from gateway.fold.refold import ReFold
from gateway.fold.renderer import RenderState, step_indices
from gateway.fold.restore import parse_restore_spec, restore_outputs
from gateway.fold.spans import split_spans
from gateway.transcript import Message, ToolCall, Transcript, text_message, tool_message
from tests.fold.conftest import Turn, numbered, protocol, source_lines, text_history, tool_history

FILES = {"src/a.py": source_lines(80, "a"), "src/b.py": source_lines(80, "b")}
LOGS = [
    "\n".join(f"{tag} line {i} of the build log, nothing to see" for i in range(12))
    for tag in "xyz"
]

# A step the model cannot find by its label is named with the call that produced it; stubs
# say how to restore only once the model has a way to.
_NAME = r"(?: \(`[^`]*`\))?"
_STUB = re.compile(
    rf"\[duplicate of step (\d+){_NAME}: (.*?)(?:; (\d+) top-level definitions kept below)?"
    r"(?: — restore \1 to see it again)?\]"
)
_LINES = re.compile(r"(?:.* )?lines (\d+)-(\d+)\)?$")
_RUN = re.compile(
    rf"\[lines (?P<lo>\d+)-(?P<hi>\d+): same as step (?P<step>\d+){_NAME} "
    r"lines (?P<from>\d+)-(?P<to>\d+)(?: \((?P<path>\S+) lines (?P<first>\d+)-\d+\))?"
    r"(?:; (?P<signatures>\d+) top-level definitions kept below)?"
    r"(?: — restore (?P<restore>\d+) to see them)?\]"
)
# a file line without its view's line number (tab, arrow, window styles) or as is
_CODE = re.compile(r"(?:\s*\d+[\t→:|])?()(.*)", re.DOTALL)
_NOTE = re.compile(r"steps? (\d+)(?:-(\d+))? folded: .* — restore (\S+) to see (?:it|them) again")
_POINTER = re.compile(r"folded, see the note at step (\d+)")
# an ask or reminder at the end of an output
_REMINDER = re.compile(r"\n\n\[(?:reminder|IMPORTANT|context protocol)")


@dataclass(frozen=True)
class Case:
    history: Transcript
    state: RenderState
    renderer: ReFold
    tool_mode: bool


def block(rng: random.Random) -> tuple[str, str]:
    """(output text, the command that produced it), drawn from a small pool so that
    whole outputs, file ranges, search hits and overlapping line windows repeat often."""
    kind = rng.choice(["view", "view", "window", "grep", "log", "short", "slice", "slice"])
    path = rng.choice(sorted(FILES))
    first = rng.choice([1, 5, 11, 21])
    body = FILES[path][first - 1 : first - 1 + rng.choice([4, 10, 35])]
    if kind == "view":
        return numbered(first, body, rng.choice(["tab", "arrow"])), f"cat -n {path}"
    if kind == "window":
        header = f"[File: /repo/{path} (80 lines total)]\n"
        return header + numbered(first, body, rng.choice(["colon", "pipe"])), f"open {path}"
    if kind == "grep":
        hits = [f"{path}:{first + i}:{code}" for i, code in enumerate(body[:8])]
        return "\n".join(hits), f"grep -n compute {path}"
    if kind == "log":
        return rng.choice(LOGS), "make"
    if kind == "slice":
        return unnumbered_view(rng, path)
    return rng.choice(["ok", "", "done\n", "error: x"]), "true"


def unnumbered_view(rng: random.Random, path: str) -> tuple[str, str]:
    """Overlapping windows of a file without line numbers, as agents view them: ``sed -n``,
    ``head``, ``cat`` (mini-swe-agent's wrapper or bare), or ``grep -A`` context."""
    lines = FILES[path]
    first = rng.randint(1, 60)
    last = min(len(lines), first + rng.choice([6, 12, 25, 45]))
    command = rng.choice(["sed", "sed", "head", "cat", "grep"])
    if command == "sed":
        call = f"sed -n '{first},{last}p' {path}"
    elif command == "head":
        first, call = 1, f"head -n {last} {path}"
    elif command == "cat":
        first, last, call = 1, len(lines), f"cat {path}"
    else:
        call = f'grep -A {last - first} "value_{first - 1} " {path}'
    text = "\n".join(lines[first - 1 : last])
    if rng.random() < 0.5:
        code = rng.choice([0, 0, 0, 1])
        text = f"<returncode>{code}</returncode>\n<output>\n{text}\n</output>"
    return text, call


TASKS = ("inspect the module", "run the tests", "fix the parser")


def with_task_list(history: Transcript, rng: random.Random) -> Transcript:
    """Some single calls made Claude Code ``TodoWrite`` calls that walk a task list: an item
    goes in progress, then completed (the steps between are a finished sub-task)."""
    messages = list(history.messages)
    updates = 0
    for i, m in enumerate(messages):
        if m.role != "assistant" or len(m.tool_calls) != 1 or rng.random() >= 0.25:
            continue
        current, done = divmod(updates, 2)
        todos = [
            {
                "content": task,
                "status": "completed"
                if n < current or (n == current and done)
                else "in_progress"
                if n == current
                else "pending",
            }
            for n, task in enumerate(TASKS)
        ]
        call = ToolCall(m.tool_calls[0].id, "TodoWrite", json.dumps({"todos": todos}))
        messages[i] = replace(
            m, parts=tuple(call if isinstance(p, ToolCall) else p for p in m.parts)
        )
        updates += 1
    return Transcript(tuple(messages))


def reply(rng: random.Random) -> str:
    if rng.random() < 0.2:
        return rng.choice(["", "running it", "**progress**: half"])
    lo = rng.randint(0, 14)
    stale = rng.choice(["-", str(lo), f"{lo}-{lo + rng.randint(0, 4)}", f"{lo}, {lo + 2}"])
    return protocol(rng.choice(["read", "ran", "edit", "plan"]), stale)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """Shape from hypothesis, content from a seeded RNG (drawing every line through
    hypothesis made generation 20x slower than the rendering under test)."""
    tool_mode = draw(st.booleans())
    rng = random.Random(draw(st.integers(0, 2**32)))
    fold = draw(st.sampled_from(["on", "auto", "off"]))
    return build_case(rng, tool_mode, draw(st.integers(1, 4)), fold)


def build_case(rng: random.Random, tool_mode: bool, k: int, fold: str) -> Case:
    turns = []
    for _ in range(rng.randint(0, 18)):
        outs, commands = [], []
        for _ in range(rng.choice([1, 1, 2, 3]) if tool_mode else 1):
            produced = [block(rng) for _ in range(rng.choice([1, 1, 2]))]
            # a command that shows one file shows it alone: numbered lines after its
            # header, or in its output, are taken for that file's lines
            if re.fullmatch(r"(cat|cat -n|open) \S+", produced[0][1]):
                produced = produced[:1]
            outs.append("\n".join(text for text, _ in produced))
            commands.append(produced[0][1])
        turns.append(Turn(reply(rng), tuple(outs), tuple(commands)))
    build = tool_history if tool_mode else text_history
    history = build(turns, system=rng.choice(["You are an agent.", None]))
    if tool_mode:
        history = with_task_list(history, rng)
    restored: set[int] = set()
    steps = step_indices(history)
    # a gateway restore exchange after an output (not between parallel outputs)
    after = [p + 1 for p in steps if all(m.role != "tool" for m in history.messages[p + 1 : p + 2])]
    if after and rng.random() < 0.3:
        at = rng.choice(after)
        wanted = rng.randrange(len(steps))
        original = history.messages[steps[wanted]].text
        if tool_mode:
            ask = Message("assistant", (ToolCall("r", "restore", f'{{"steps": "{wanted}"}}'),))
            answer = tool_message("r", f"[restored step {wanted}]\n{original}")
        else:
            ask = text_message("assistant", f"restore {wanted}")
            answer = text_message("user", f"[restored step {wanted}]\n{original}")
        messages = list(history.messages)
        messages[at:at] = [ask, answer]
        history = Transcript(tuple(messages))
        restored.add(at + 1)
    pinned = frozenset(rng.sample(range(12), rng.choice([0, 0, 1, 2])))
    renderer = ReFold(k=k, dedup=rng.random() < 0.8, fold=fold)
    # Full KV pressure makes every fold pay; none makes most wait (both must be sound).
    pressure = rng.choice([0.0, 1.0])
    return Case(history, RenderState(frozenset(restored), pinned, pressure), renderer, tool_mode)


def step_texts(case: Case, rendered: Transcript) -> list[tuple[int, str, str]]:
    """(step, original text, rendered text) for every step."""
    head = len(rendered.messages) - len(case.history.messages)
    return [
        (n, case.history.messages[pos].text, rendered.messages[head + pos].text)
        for n, pos in enumerate(step_indices(case.history, case.state))
    ]


def unlabelled(step: int, text: str) -> str:
    """A step's rendered text without its ``[step N]`` label, if it has one."""
    return text.removeprefix(f"[step {step}]\n")


def numbered_pairs(text: str) -> set[tuple[int, str]]:
    pairs = set()
    for span in split_spans(text):
        if span.kind == "file":
            pairs.update(zip(range(span.first_line, span.last_line + 1), span.codes, strict=True))
    return pairs


def check_stubs(case: Case, step: int, original: str, body: str, shown: dict[int, str]) -> int:
    """Walk ``body`` against ``original`` line by line: every line is either the original
    line or a stub. Each stub must stand for original content that the step it names holds
    (restored from the history); a line-run stub's copy must also be visible, contiguous,
    in that step's rendering. Returns the number of stubs."""

    def source(named: int) -> str:
        assert named <= step, f"step {step} stub names a later step {named}"
        named_body = unlabelled(named, shown[named])
        assert not _NOTE.fullmatch(named_body) and not _POINTER.fullmatch(named_body), (
            "stub names a folded step"
        )
        return restore_outputs(case.history, case.state, named, named)[0][1]

    lines, out = original.split("\n"), body.split("\n")
    whole = _STUB.fullmatch(out[0])
    if whole and whole.group(2).startswith("this entire output"):
        assert original in source(int(whole.group(1)))
        assert len(out) == 1 + int(whole.group(3) or 0)
        assert all(line in lines for line in out[1:]) and len(body) < len(original)
        return 1
    starts = list(itertools.accumulate((len(line) + 1 for line in lines[:-1]), initial=0))
    spans = {starts.index(s.start): s for s in split_spans(original)[1:]}
    stubs, i, j = 0, 0, 0
    while j < len(out):
        run, span_stub = _RUN.fullmatch(out[j]), _STUB.fullmatch(out[j])
        if not run and not span_stub:
            assert out[j] == lines[i], f"step {step}: line {i} changed"
            i, j = i + 1, j + 1
            continue
        stubs += 1
        if run:
            lo, hi = int(run["lo"]) - 1, int(run["hi"])
            assert lo == i and hi - lo >= MIN_RUN_LINES
            assert run["restore"] is None or int(run["restore"]) == step
            named, region = int(run["step"]), lines[lo:hi]
            assert named < step, "a line run names an earlier step"
            copy = source(named).split("\n")[int(run["from"]) - 1 : int(run["to"])]
            assert copy == region, f"step {step}: run stub names other lines of step {named}"
            assert "\n".join(region) in shown[named], "the named step does not show the run"
            if run["path"]:
                file_lines = FILES[run["path"].removeprefix("/repo/")]
                first = int(run["first"])
                assert (
                    [_CODE.fullmatch(line)[2] for line in region]
                    == (  # type: ignore[index]
                        file_lines[first - 1 : first - 1 + len(region)]
                    )
                ), f"run stub names the wrong file lines: {out[j]} {region[:2]}"
            signatures = int(run["signatures"] or 0)
        else:
            span = spans[i]
            named = int(span_stub[1])  # type: ignore[index]
            hi = bisect.bisect_right(starts, span.end)
            region_text = original[span.start : span.end]
            text = source(named) if named < step else original[: span.start]
            if span.kind == "file" and (numbers := _LINES.match(span_stub[2])):  # type: ignore[index]
                assert (int(numbers[1]), int(numbers[2])) == (span.first_line, span.last_line)
            assert region_text in text or (
                span.kind == "file" and numbered_pairs(region_text) <= numbered_pairs(text)
            ), f"step {step}: stub naming step {named} stands for content that step lacks"
            region = lines[i:hi]
            signatures = int(span_stub[3] or 0)  # type: ignore[index]
        kept = out[j + 1 : j + 1 + signatures]
        assert all(line in region for line in kept)
        assert len("\n".join(out[j : j + 1 + signatures])) < len("\n".join(region))
        i, j = hi, j + 1 + signatures
    assert i == len(lines), f"step {step}: original lines missing from the rendering"
    return stubs


@settings(max_examples=1000, deadline=None)
@given(cases())
def test_reversibility_every_stub_and_note_restores_the_exact_original(case: Case) -> None:
    rendered = case.renderer.render(case.history, case.state)
    texts = step_texts(case, rendered.transcript)
    shown = {n: text for n, _, text in texts}
    stubs = 0
    for n, original, text in texts:
        assert restore_outputs(case.history, case.state, n, n) == [(n, original)]
        body = unlabelled(n, text)
        if note := _NOTE.fullmatch(body):
            # the note's restore command, read by the gateway's own parser, names its steps
            first, last = parse_restore_spec(note.group(3))
            assert (int(note.group(1)), int(note.group(2) or note.group(1))) == (first, last)
            assert first == n and note.group(3) == (f"{first}-{last}" if last > first else str(n))
            restored = restore_outputs(case.history, case.state, first, last)
            assert [t for _, t in restored] == [texts[i][1] for i in range(first, last + 1)]
            for i in range(first + 1, last + 1):
                assert shown[i] == f"[step {i}]\nfolded, see the note at step {first}"
        elif pointer := _POINTER.fullmatch(body):
            assert _NOTE.fullmatch(shown[int(pointer.group(1))].split("\n", 1)[1])
        elif body.startswith(original) and (
            body == original or _REMINDER.match(body, len(original))
        ):
            continue
        else:
            if (extra := _REMINDER.search(body)) is not None:
                body = body[: extra.start()]  # an ask or reminder after a stubbed output
            stubs += check_stubs(case, n, original, body, shown)
    assert stubs == rendered.stats.stubs


@settings(max_examples=200, deadline=None)
@given(cases())
def test_determinism_and_pairing(case: Case) -> None:
    first = case.renderer.render(case.history, case.state)
    again = ReFold(k=case.renderer.k, dedup=case.renderer.dedup, fold=case.renderer.fold)
    second = again.render(case.history, case.state)
    assert first.transcript == second.transcript and first.stats == second.stats
    messages = first.transcript.messages
    assert sum(m.role == "tool" for m in messages) == sum(
        m.role == "tool" for m in case.history.messages
    )
    for i, m in enumerate(messages):
        calls = m.tool_calls if m.role == "assistant" else ()
        answers = messages[i + 1 : i + 1 + len(calls)]
        assert [a.tool_call_id for a in answers] == [c.id for c in calls]
        if m.role == "tool":
            j = i - 1
            while messages[j].role == "tool":
                j -= 1
            assert m.tool_call_id in {c.id for c in messages[j].tool_calls}


@settings(max_examples=150, deadline=None)
@given(cases())
def test_prefix_property_and_cache_equality_as_the_history_grows(case: Case) -> None:
    """Warm and cold renders agree, and the rendering only grows at its end except where
    the pricing rule chose a rewrite; the one other change allowed is an ask or reminder
    leaving the end of the newest output once a reply follows it (no cached token after it)."""
    r = case.renderer
    cache, previous, previous_rewrites = None, None, 0
    for end in range(1, len(case.history.messages) + 1):
        part = case.history.with_messages(case.history.messages[:end])
        state = replace(case.state, restored=frozenset(i for i in case.state.restored if i < end))
        warm = r.render(part, state, cache)
        cold = r.render(part, state)
        assert warm.transcript == cold.transcript and warm.stats == cold.stats
        cache = warm.cache
        messages = warm.transcript.messages
        if previous is not None and warm.stats.rewrites == previous_rewrites:
            changed = [i for i, m in enumerate(previous) if messages[i] != m]
            assert len(changed) <= 1, f"rewrote {changed} without a priced rewrite"
            for i in changed:
                old, new = previous[i].text, messages[i].text
                assert old.startswith(new) and _REMINDER.match(old, len(new))
                # it ended the previous prompt (a reply after it was never sent to a model)
                assert all(m.role == "assistant" for m in previous[i + 1 :])
        previous, previous_rewrites = messages, warm.stats.rewrites


def test_generated_histories_exercise_every_kind_of_stub() -> None:
    """The generator above must keep producing what the properties are about."""
    seen: Counter[str] = Counter()
    rng = random.Random(7)
    for _ in range(150):
        case = build_case(rng, rng.random() < 0.5, rng.randint(1, 4), rng.choice(["on", "auto"]))
        for line in case.renderer.render(case.history, case.state).transcript.messages:
            for text in line.text.split("\n"):
                if run := _RUN.fullmatch(text):
                    seen["run with path" if run["path"] else "run"] += 1
                elif stub := _STUB.fullmatch(text):
                    seen["whole" if "entire" in stub[2] else "span"] += 1
                elif _NOTE.search(text):
                    seen["fold"] += 1
                    seen["finished"] += "folded: finished: " in text
                    seen["superseded"] += "superseded: `" in text
    kinds = ("run with path", "run", "whole", "span", "fold", "finished", "superseded")
    assert min(seen[kind] for kind in kinds) >= 5, seen


def test_reminder_suffix_pattern_matches_every_level() -> None:
    for level in (1, 2, 3, 7):
        assert _REMINDER.match("\n\n" + reminder_text(level))
