"""Locust users that replay recorded agent sessions through foldgate (or straight to vLLM).

One user is one agent session at a time: it replays a recorded trajectory the way its
harness sent it (``loadtests.sessions``), streaming, with the session id header, waits a
think time between steps (the recorded gap where the trajectory's log has timestamps, else
a lognormal draw; none with ``--think-time 0``), then starts the next trajectory as a new
session. Besides the
HTTP request itself, every reply is reported to Locust as its own events, so they appear in
Locust's statistics and CSV files:

=========  ========================  ===================================================
type       name                      "response time" column holds
=========  ========================  ===================================================
LLM        time_to_first_token       ms until the first generated token
LLM        time_to_last_token        ms until the stream ended
TOKENS     prompt_tokens             the reply's ``usage`` prompt tokens
TOKENS     cached_tokens             of which the replica served from its prefix cache
TOKENS     raw_prompt_tokens         ``x-foldgate-prompt-tokens-raw`` (gateway only)
TOKENS     rendered_prompt_tokens    ``x-foldgate-prompt-tokens-rendered`` (gateway only)
=========  ========================  ===================================================

A non-2xx status, an error event inside the stream, a stream cut before its last event or
one without usage is a Locust failure carrying the status and the error body.

    locust -f loadtests/locustfile.py --host http://127.0.0.1:8080            # web UI
    locust -f loadtests/locustfile.py --host http://127.0.0.1:8080 --headless \\
        -u 4 -r 1 -t 2m --max-steps 12 --think-time 0 --csv out/run
    locust -f loadtests/step_load.py ...                                      # step loads
"""

from __future__ import annotations

import csv
import itertools
import json
import random
import time
import uuid
from functools import lru_cache
from pathlib import Path
from typing import IO, Any

import gevent
import gevent.lock
from locust import FastHttpUser, constant, events, task
from locust.env import Environment
from locust.exception import StopUser
from locust.runners import LocalRunner, WorkerRunner
from locust.stats import PERCENTILES_TO_REPORT, StatsCSV

from loadtests.sessions import Session, Step, replayable_sessions
from loadtests.stream import ReplyStream
from offline.think_time import ThinkTime

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRAJECTORIES = ROOT.parent / "shared" / "trajectories" / "raw"
SESSION_HEADER = "x-session-id"
STRATEGY_HEADER = "x-foldgate-strategy"
RAW_TOKENS_HEADER = "x-foldgate-prompt-tokens-raw"
RENDERED_TOKENS_HEADER = "x-foldgate-prompt-tokens-rendered"
ADMISSION_WAIT_HEADER = "x-foldgate-admission-wait"
ADMISSION_HEADER = "x-foldgate-admission"
REPLICA_HEADER = "x-foldgate-replica"


@events.init_command_line_parser.add_listener
def add_arguments(parser: Any) -> None:
    group = parser.add_argument_group("foldgate session replay")
    group.add_argument(
        "--trajectories",
        default=str(DEFAULT_TRAJECTORIES),
        help="Comma-separated trajectory files or folders, any format the importers read.",
    )
    group.add_argument("--model", default="tiny", help="Model name sent in each request.")
    group.add_argument(
        "--tokenizer",
        default="",
        help="Counts the recorded replies' tokens (max_tokens): qwen3.6 | estimate | "
        "hf:/path/tokenizer.json (default: qwen3.6 when installed, else estimate).",
    )
    group.add_argument(
        "--max-steps", type=int, default=0, help="Replay only the first N steps (0: all)."
    )
    group.add_argument(
        "--max-tokens-cap",
        type=int,
        default=0,
        help="Cap on max_tokens (0: the recorded reply's token count).",
    )
    group.add_argument(
        "--think-time",
        default="3:0.8",
        help="Think time between steps where the trajectory logged none: lognormal, "
        "MEDIAN[:SIGMA] seconds. 0: saturation (no think time at all, recorded or not).",
    )
    group.add_argument(
        "--think-cap",
        type=float,
        default=60.0,
        help="Longest recorded think time waited, seconds (longer pauses are cut to it).",
    )
    group.add_argument(
        "--no-recorded-think",
        action="store_true",
        help="Ignore the trajectories' timestamps: always draw from --think-time.",
    )
    group.add_argument(
        "--sessions-per-user",
        type=int,
        default=0,
        help="Sessions each user replays before it stops (0: until the run ends). When every "
        "user of a single-process run is done, the run ends.",
    )
    group.add_argument(
        "--strategy", default="", help="Send x-foldgate-strategy (default: the gateway's)."
    )
    group.add_argument(
        "--replicas",
        default="",
        help="No-gateway arm: comma-separated vLLM URLs, requests spread round-robin.",
    )
    group.add_argument(
        "--request-log", default="", help="Append one JSON line per request to this file."
    )
    group.add_argument(
        "--session-prefix",
        default="",
        help="Prefix of the session ids (default: a random one per run).",
    )
    group.add_argument("--seed", type=int, default=0, help="Think-time random seed.")


@lru_cache(maxsize=4)
def load_sessions(
    paths: str, model: str, max_steps: int, max_tokens_cap: int, tokenizer: str = ""
) -> tuple[Session, ...]:
    """The replayable sessions of every trajectory under ``paths`` (cached per process)."""
    sessions = replayable_sessions(
        [p for p in paths.split(",") if p],
        model,
        max_steps=max_steps or None,
        max_tokens_cap=max_tokens_cap or None,
        tokenizer=tokenizer,
    )
    if not sessions:
        raise ValueError(f"no replayable trajectories in {paths}")
    return sessions


class RequestLog:
    """One JSON line per request, one file per Locust process (workers add their index)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: IO[str] | None = None

    def write(self, environment: Environment, record: dict[str, Any]) -> None:
        if not self.path:
            return
        if self._file is None:
            runner = environment.runner
            suffix = f".worker{runner.worker_index}" if isinstance(runner, WorkerRunner) else ""
            self._file = open(f"{self.path}{suffix}", "a", encoding="utf-8")  # noqa: SIM115
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()


@events.init.add_listener
def write_final_stats_at_quit(environment: Environment, **_: Any) -> None:
    """Locust rewrites ``<csv>_stats.csv`` once a second and not at exit, so the requests of
    a run's last second were missing from it (all of them, when a loaded machine delayed its
    writer past a short run). Write it once more after the users stopped."""
    prefix = getattr(environment.parsed_options, "csv_prefix", None)
    if not prefix or isinstance(environment.runner, WorkerRunner):
        return

    def write(**_: Any) -> None:
        with open(f"{prefix}_stats.csv", "w", newline="", encoding="utf-8") as f:
            StatsCSV(environment, PERCENTILES_TO_REPORT).requests_csv(csv.writer(f))

    environment.events.quit.add_listener(write)


_request_log: RequestLog | None = None
_loading = gevent.lock.Semaphore()
_run_prefix = uuid.uuid4().hex[:8]
_finished_users = 0


def request_log(path: str) -> RequestLog:
    global _request_log
    if _request_log is None or _request_log.path != path:
        _request_log = RequestLog(path)
    return _request_log


class AgentSession(FastHttpUser):
    """Replays recorded sessions, one after another, as its harness sent them."""

    # Think time is drawn inside the task (between steps of one session, not between
    # sessions); a new session starts at once.
    wait_time = constant(0)
    network_timeout = 900.0
    connection_timeout = 30.0
    _users = itertools.count()
    _replica_turn = itertools.count()

    def on_start(self) -> None:
        opts = self.environment.parsed_options
        # Parsing and tokenizing takes seconds of CPU: done once per process, in a native
        # thread, so that the gevent loop keeps a distributed worker's heartbeats going.
        with _loading:
            self.sessions = gevent.get_hub().threadpool.apply(
                load_sessions,
                (
                    opts.trajectories,
                    opts.model,
                    opts.max_steps,
                    opts.max_tokens_cap,
                    opts.tokenizer,
                ),
            )
        self.think = ThinkTime.parse(
            opts.think_time, cap_s=opts.think_cap, recorded=not opts.no_recorded_think
        )
        self.replicas = [u.rstrip("/") for u in opts.replicas.split(",") if u]
        self.log = request_log(opts.request_log)
        runner = self.environment.runner
        # Users of all processes interleave: worker w of W numbers its users w, w+W, ...
        distributed = isinstance(runner, WorkerRunner)
        worker = runner.worker_index if distributed else 0
        # --processes forks the workers before the master learns its worker count.
        workers = max(1, opts.processes or opts.expect_workers) if distributed else 1
        self.index = next(AgentSession._users) * workers + worker
        self.rng = random.Random(f"{opts.seed}:{self.index}")
        self.prefix = opts.session_prefix or _run_prefix
        self.sessions_done = 0

    @task
    def replay_session(self) -> None:
        opts = self.environment.parsed_options
        session = self.sessions[(self.index + self.sessions_done) % len(self.sessions)]
        session_id = f"{self.prefix}:{session.trajectory}:{self.index}.{self.sessions_done}"
        for n, step in enumerate(session.steps):
            think_s = self.think.sample(self.rng, step.think_s) if n else 0.0
            gevent.sleep(think_s)
            self.send(session, step, session_id, think_s)
        self.sessions_done += 1
        if opts.sessions_per_user and self.sessions_done >= opts.sessions_per_user:
            self._finish()

    def _finish(self) -> None:
        global _finished_users
        _finished_users += 1
        runner = self.environment.runner
        if isinstance(runner, LocalRunner) and _finished_users >= runner.target_user_count:
            gevent.spawn(runner.quit)  # every session replayed: the run is over
        raise StopUser()

    def _url(self, session: Session) -> str:
        if not self.replicas:
            return session.path
        replica = self.replicas[next(AgentSession._replica_turn) % len(self.replicas)]
        return replica + session.path

    def send(self, session: Session, step: Step, session_id: str, think_s: float = 0.0) -> None:
        opts = self.environment.parsed_options
        headers = {SESSION_HEADER: session_id}
        if opts.strategy:
            headers[STRATEGY_HEADER] = opts.strategy
        if session.dialect == "anthropic":
            headers.update({"anthropic-version": "2023-06-01", "x-api-key": "unused"})
        reader = ReplyStream(session.dialect)
        started_at = time.time()
        started = time.perf_counter()
        status = 0
        with self.client.request(
            "POST",
            self._url(session),
            name=f"{session.dialect} {session.path}",
            json=step.body,
            headers=headers,
            stream=True,
            catch_response=True,
        ) as resp:
            status = resp.status_code or 0
            problem: str | None
            if getattr(resp, "error", None) is not None and not status:
                problem = f"connection failed: {resp.error}"
            elif status != 200:
                body = resp.content or str(getattr(resp, "error", "")).encode()
                problem = f"HTTP {status}: {body[:2000].decode('utf-8', 'replace')}"
            else:
                # Line by line: FastResponse.iter_content(n) blocks until n bytes arrived,
                # which would date the first token at the end of a short reply.
                stream = resp._response
                while line := stream.readline(b"\n"):
                    reader.feed(line)
                problem = reader.problem
            if problem is not None:
                resp.failure(problem)
            else:
                resp.success()
            resp_headers = resp.headers or {}
        ended = time.perf_counter()
        raw = _int(resp_headers.get(RAW_TOKENS_HEADER))
        rendered = _int(resp_headers.get(RENDERED_TOKENS_HEADER))
        admission_wait = _float(resp_headers.get(ADMISSION_WAIT_HEADER))
        ttft_ms = None if reader.first_token_at is None else (reader.first_token_at - started) * 1e3
        ttlt_ms = (ended - started) * 1e3
        if problem is None:
            self._metric("LLM", "time_to_last_token", ttlt_ms)
            if ttft_ms is not None:
                self._metric("LLM", "time_to_first_token", ttft_ms)
            self._metric("TOKENS", "prompt_tokens", reader.prompt_tokens)
            self._metric("TOKENS", "cached_tokens", reader.cached_tokens)
            self._metric("TOKENS", "raw_prompt_tokens", raw)
            self._metric("TOKENS", "rendered_prompt_tokens", rendered)
        self.log.write(
            self.environment,
            {
                "start": started_at,
                "end": started_at + (ended - started),
                "session": session_id,
                "trajectory": session.trajectory,
                "step": step.index,
                "think_s": think_s,
                "dialect": session.dialect,
                "users": self.environment.runner.user_count,
                "status": status,
                "ok": problem is None,
                "error": problem,
                "ttft_ms": ttft_ms,
                "ttlt_ms": ttlt_ms,
                "max_tokens": step.reply_tokens,
                "prompt_tokens": reader.prompt_tokens,
                "cached_tokens": reader.cached_tokens,
                "completion_tokens": reader.completion_tokens,
                "raw_prompt_tokens": raw,
                "rendered_prompt_tokens": rendered,
                "admission_wait_s": admission_wait,
                "admission": resp_headers.get(ADMISSION_HEADER),
                "replica": resp_headers.get(REPLICA_HEADER),
            },
        )

    def _metric(self, kind: str, name: str, value: float | None) -> None:
        if value is None:
            return
        self.environment.events.request.fire(
            request_type=kind,
            name=name,
            response_time=value,
            response_length=0,
            exception=None,
            context={},
        )


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
