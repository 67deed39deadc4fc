import json
import subprocess
import sys
from pathlib import Path

import click
from click.testing import CliRunner

from gateway.cli import SUBCOMMANDS, main

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "inventory-reserve-fix.jsonl"


def test_group_and_replay_help() -> None:
    runner = CliRunner()
    top = runner.invoke(main, ["--help"])
    assert top.exit_code == 0 and "replay" in top.output
    sub = runner.invoke(main, ["replay", "--help"])
    assert sub.exit_code == 0
    for option in ("--strategy", "--tokenizer", "--budget", "--cache-blocks", "--json", "--plot"):
        assert option in sub.output


def test_every_subcommand_loads_under_its_own_name() -> None:
    ctx = click.Context(main)
    for name in SUBCOMMANDS:
        command = main.get_command(ctx, name)
        assert isinstance(command, click.Command) and command.name == name


def test_serve_does_not_import_the_offline_wing() -> None:
    # A gateway start must not pay for the simulator, the replay or matplotlib.
    probe = (
        "import sys; from gateway.cli import main; import click; "
        "main.get_command(click.Context(main), 'serve'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('offline', 'loadtests', 'matplotlib')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_replay_writes_json_and_plot(tmp_path: Path) -> None:
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    result = CliRunner().invoke(
        main,
        [
            "replay",
            str(EXAMPLE),
            "--strategy",
            "base,refold,cliff,mask,clip",
            "--budget",
            "2000",
            "--tokenizer",
            "estimate",
            "--json",
            str(out),
            "--plot",
            str(png),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "fold inactive: no PROGRESS/STALE lines" in result.output
    data = json.loads(out.read_text())
    assert data["tokenizer_is_estimate"] is True
    totals = data["totals"]
    assert list(totals) == ["base", "refold", "cliff", "mask", "clip"]
    assert totals["base"]["requests"] == 13  # 12 tool steps + the final answer
    assert totals["base"]["rewrites"] == 0
    assert totals["cliff"]["prompt_tokens"] < totals["base"]["prompt_tokens"]
    assert totals["cliff"]["compactions"] >= 1
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_unknown_strategy_is_a_clear_error() -> None:
    result = CliRunner().invoke(main, ["replay", str(EXAMPLE), "--strategy", "base,nope"])
    assert result.exit_code == 2
    assert "unknown strategy 'nope'" in result.output


def test_bad_tokenizer_is_a_clear_error() -> None:
    result = CliRunner().invoke(main, ["replay", str(EXAMPLE), "--tokenizer", "gpt9"])
    assert result.exit_code == 2 and "unknown tokenizer 'gpt9'" in result.output


def test_not_a_trajectory(tmp_path: Path) -> None:
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"hello": 1}\n')
    result = CliRunner().invoke(main, ["replay", str(bad), "--strategy", "base"])
    assert result.exit_code == 2
    assert "x.jsonl" in result.output


def test_a_bad_file_among_good_ones_is_skipped_unless_strict(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "good.jsonl").write_text(EXAMPLE.read_text())
    (logs / "broken.jsonl").write_text("{not json\n")
    args = ["replay", str(logs), "--strategy", "base", "--tokenizer", "estimate"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "skipped" in result.output and "broken.jsonl:1: malformed JSON line" in result.output
    strict = CliRunner().invoke(main, [*args, "--strict"])
    assert strict.exit_code == 2
    assert "broken.jsonl:1: malformed JSON line" in strict.output
