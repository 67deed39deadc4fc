"""``foldgate sessions``: a running gateway's sessions from the command line (its
``/v1/sessions`` endpoints, over HTTP), as rich tables."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from gateway.serve import DEFAULT_PORT

TIMEOUT_S = 30.0
# How the kinds of rendered messages are coloured (the inspector page uses the same).
KIND_STYLE = {
    "stub": "bold dark_orange",
    "fold": "bold magenta",
    "summary": "bold red",
    "masked": "bold red",
    "clipped": "bold red",
    "rewritten": "bold red",
    "added": "bold blue",
}
PREVIEW_CHARS = 100


class Gateway:
    def __init__(self, url: str, api_key: str | None) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key

    def get(self, path: str, **query: Any) -> dict[str, Any]:
        params = urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        request = urllib.request.Request(self.url + path + (f"?{params}" if params else ""))
        if self.api_key:
            request.add_header("authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read())["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = exc.reason
            raise click.ClickException(f"{exc.code}: {message}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise click.ClickException(f"cannot reach the gateway at {self.url}: {exc}") from exc


def session_path(session: str) -> str:
    return "/v1/sessions/" + urllib.parse.quote(session, safe="")


@click.group("sessions")
@click.option(
    "--url",
    envvar="FOLDGATE_URL",
    default=f"http://127.0.0.1:{DEFAULT_PORT}",
    show_default=True,
    help="The gateway's base URL (env FOLDGATE_URL).",
)
@click.option(
    "--api-key", envvar="FOLDGATE_API_KEY", help="Picks the tenant (env FOLDGATE_API_KEY)."
)
@click.pass_context
def sessions(ctx: click.Context, url: str, api_key: str | None) -> None:
    """Your tenant's sessions on a running gateway: tokens, cache, stubs, folds, restores."""
    ctx.obj = Gateway(url, api_key)


@sessions.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON instead.")
@click.pass_obj
def list_command(gateway: Gateway, as_json: bool) -> None:
    """One line per session, most recently used first."""
    data: list[dict[str, Any]] = []
    after = None
    while True:  # the API's pages, each from the cursor the previous one gave
        page = gateway.get("/v1/sessions", after=after)
        data += page["data"]
        if not page["has_more"]:
            break
        after = page["next_cursor"]
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    table = Table(title=f"sessions on {gateway.url}")
    table.add_column("session", overflow="fold")
    for name in ("requests", "tokens raw → rendered", "saved", "upstream (cached)"):
        table.add_column(name, justify="right")
    for name in ("stubs/folds", "restores", "compactions"):
        table.add_column(name, justify="right")
    table.add_column("replica", overflow="fold")
    table.add_column("last request")
    for s in data:
        table.add_row(
            Text(s["id"]),
            f"{s['requests']:,}",
            f"{s['raw_tokens']:,} → {s['rendered_tokens']:,}",
            _pct(s["saved_tokens"], s["raw_tokens"]),
            f"{s['upstream_prompt_tokens']:,} "
            f"({_pct(s['upstream_cached_tokens'], s['upstream_prompt_tokens'])})",
            f"{s['stubs']}/{s['folds']}",
            str(s["restores"]),
            str(s["compactions"]),
            Text(s["replica"] or "-"),
            _when(s["last_request_at"]),
        )
    Console().print(table if data else "no sessions for this tenant")


@sessions.command("show")
@click.argument("session")
@click.option(
    "--request",
    "number",
    type=click.IntRange(min=1),
    help="Also print what the model saw at this request (1 = the first).",
)
@click.option("--branch", type=click.IntRange(min=0), help="A branch other than the head.")
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON instead.")
@click.pass_obj
def show_command(
    gateway: Gateway, session: str, number: int | None, branch: int | None, as_json: bool
) -> None:
    """A session's figures and its requests; with --request N, the context sent at N."""
    path = session_path(session)
    detail = gateway.get(path, branch=branch)
    view = gateway.get(path + "/render", request=number, branch=branch) if number else None
    if as_json:
        click.echo(json.dumps({"session": detail, "render": view} if view else detail, indent=2))
        return
    console = Console()
    summary = Table(title=f"session {escape(session)}", show_header=False)
    summary.add_column(justify="left")
    summary.add_column(justify="right")
    rows: tuple[tuple[str, str | Text], ...] = (
        ("requests", f"{detail['requests']:,}"),
        ("raw tokens (estimate)", f"{detail['raw_tokens']:,}"),
        ("rendered tokens (estimate)", f"{detail['rendered_tokens']:,}"),
        ("saved", _pct(detail["saved_tokens"], detail["raw_tokens"])),
        (
            "removed by stubs / by folds",
            f"{detail['rendered_tokens_removed_by_stubs']:,} / "
            f"{detail['rendered_tokens_removed_by_folds']:,}",
        ),
        ("added (protocol, labels, notes)", f"{detail['rendered_tokens_added']:,}"),
        ("upstream prompt tokens", f"{detail['upstream_prompt_tokens']:,}"),
        (
            "cached by the replica",
            _pct(detail["upstream_cached_tokens"], detail["upstream_prompt_tokens"]),
        ),
        ("stubs / folds now", f"{detail['stubs']} / {detail['folds']}"),
        ("restores", str(detail["restores"])),
        ("compactions", str(detail["compactions"])),
        ("bound to replica", Text(detail["replica"] or "-")),
        ("branches (head)", f"{detail['branches']} ({detail['head_branch']})"),
    )
    for label, value in rows:
        summary.add_row(label, value)
    console.print(summary)
    requests = Table(title=f"requests of branch {detail['branch']}")
    for name in ("#", "messages", "strategy", "raw", "rendered", "upstream", "cached"):
        requests.add_column(name, justify="left" if name == "strategy" else "right")
    for name in ("stubs", "folds", "restores", "replica"):
        requests.add_column(name, justify="left" if name == "replica" else "right")
    for r in detail["log"]:
        requests.add_row(
            str(r["request"]),
            str(r["messages"]),
            r["strategy"],
            f"{r['raw_tokens']:,}",
            f"{r['rendered_tokens']:,}",
            f"{r['upstream_prompt_tokens']:,}",
            f"{r['upstream_cached_tokens']:,}",
            str(r["stubs"]),
            str(r["folds"]),
            str(r["restores"]),
            Text(r["replica"]),
        )
    console.print(requests)
    if view is not None:
        console.print(_render_table(view))


def _render_table(view: dict[str, Any]) -> Table:
    """The context sent at one request, one row per message, with both boundaries."""
    table = Table(
        title=f"what the model saw at request {view['request']} "
        f"({view['record']['strategy']}, ~{view['tokens']['rendered']:,} of "
        f"~{view['tokens']['history']:,} history tokens)"
    )
    for name in ("#", "from", "role", "kind", "tokens", "text"):
        table.add_column(name, justify="right" if name in {"#", "from", "tokens"} else "left")
    boundary = view["chunk_boundary"] if view["stats"]["boundary"] else None
    cached = view["cached_prefix"]
    for m in view["rendered"]:
        if boundary and m["index"] == boundary["rendered_index"]:
            table.add_section()
            table.add_row(
                "",
                "",
                "",
                Text("chunk boundary", "magenta"),
                "",
                f"only steps below {boundary['step']} may be folded or compacted",
            )
        if cached and m["index"] == cached["messages"]:
            table.add_section()
            table.add_row(
                "",
                "",
                "",
                Text("cached prefix", "green"),
                f"~{cached['tokens']:,}",
                f"everything above was sent identically at request {view['request'] - 1}",
            )
        preview = m["text"].replace("\n", " ⏎ ")
        if len(preview) > PREVIEW_CHARS:
            preview = preview[:PREVIEW_CHARS] + "…"
        table.add_row(
            str(m["index"]),
            "-" if m["source"] is None else str(m["source"]),
            m["role"],
            Text(m["kind"], KIND_STYLE.get(m["kind"], "")),
            f"{m['tokens']:,}",
            Text(preview),
        )
    return table


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _when(at: float | None) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S") if at else "-"
