"""The replica launcher without vLLM: flags, environment, input errors, stop, failures."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from deploy.cpu import processes
from deploy.cpu import replicas as rp
from deploy.cpu import vllm_server as vs
from deploy.cpu.replicas import Replica, ReplicaError, parse_bytes, start_replicas


@pytest.mark.parametrize(
    ("text", "value"),
    [("268435456", 268435456), ("256M", 256 * 2**20), ("1g", 2**30), ("512KiB", 512 * 1024)],
)
def test_parse_bytes(text: str, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "12X", "-5", "0", "1.5G"])
def test_parse_bytes_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="byte size"):
        parse_bytes(text)


def test_server_command_carries_the_serving_flags() -> None:
    cmd = vs.server_command(Path("/py"), Path("/m"), "tiny", 8123, 2**28, block_size=32)
    assert cmd[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(cmd)
    for flag in (
        "--model /m",
        "--served-model-name tiny",
        "--port 8123",
        "--block-size 32",
        "--kv-cache-memory-bytes 268435456",
        "--enable-prefix-caching",
        "--scheduling-policy priority",
        "--enable-prompt-tokens-details",
        "--tool-call-parser hermes",
    ):
        assert flag in joined


def test_server_env_pins_core_and_private_tmp(tmp_path: Path) -> None:
    env = vs.server_env(3, tmp_path, base={"PYTHONPATH": "/gw", "HOME": "/root"})
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "3"
    assert env["TMPDIR"] == env["VLLM_RPC_BASE_PATH"] == str(tmp_path)
    assert env["HF_HUB_OFFLINE"] == "1" and env["HOME"] == "/root"
    assert "PYTHONPATH" not in env


def test_replica_record_round_trip(tmp_path: Path) -> None:
    r = Replica("http://127.0.0.1:1", 1, 42, tmp_path / "log", 0, tmp_path)
    assert Replica.from_json(json.loads(json.dumps(r.to_json()))) == r
    with pytest.raises(ValueError, match="not a replica record"):
        Replica.from_json({"url": "x"})


def _model(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def test_start_rejects_bad_inputs(tmp_path: Path) -> None:
    model = _model(tmp_path)
    py = Path(sys.executable)
    with pytest.raises(ValueError, match="at least one replica"):
        start_replicas(0, model_dir=model, python=py)
    with pytest.raises(ValueError, match="distinct ports"):
        start_replicas(2, ports=[9000, 9000], model_dir=model, python=py)
    with pytest.raises(ReplicaError, match=r"no vLLM Python .*install\.sh"):
        start_replicas(1, model_dir=model, python=tmp_path / "nope")
    with pytest.raises(ReplicaError, match=r"no model at .*\(config\.json missing\)"):
        start_replicas(1, model_dir=tmp_path / "empty", python=py)


def test_start_refuses_a_busy_port(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ReplicaError, match=rf"ports already in use: \[{port}\]"):
            start_replicas(1, ports=[port], model_dir=_model(tmp_path), python=Path(sys.executable))


def test_free_ports_with_an_offset_skips_a_port_whose_partner_is_taken(monkeypatch) -> None:
    # The first partner port (a KV-events port) is in use: its port is passed over.
    refused: list[int] = []

    class FirstPartnerTaken(socket.socket):
        def bind(self, address) -> None:
            if address[0] == "0.0.0.0" and not refused:
                refused.append(address[1])
                raise OSError(98, "Address already in use")
            super().bind(address)

    monkeypatch.setattr(rp.socket, "socket", FirstPartnerTaken)
    ports = rp.free_ports(2, offset=vs.KV_EVENTS_PORT_OFFSET)
    assert len(set(ports)) == 2 and refused[0] - vs.KV_EVENTS_PORT_OFFSET not in ports
    for port in ports:  # each one's partner was free, and is again
        with socket.socket() as s:
            s.bind(("0.0.0.0", port + vs.KV_EVENTS_PORT_OFFSET))


def test_a_server_that_dies_reports_its_log(tmp_path: Path) -> None:
    # The gateway's Python has no vllm: the server exits at once, a real startup failure.
    before = set(Path(tempfile.gettempdir()).glob("foldgate-vllm-*"))
    with pytest.raises(ReplicaError) as info:
        start_replicas(
            1,
            ports=rp.free_ports(1),
            model_dir=_model(tmp_path),
            python=Path(sys.executable),
            log_dir=tmp_path / "logs",
            ready_timeout_s=60,
        )
    message = str(info.value)
    assert "exited with code 1 before it was ready" in message
    assert "cause: " in message and "No module named 'vllm'" in message
    assert set(Path(tempfile.gettempdir()).glob("foldgate-vllm-*")) == before


def test_log_tail_leads_with_the_root_cause(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(
        "(APIServer) WARNING [system_utils.py:255] fd limit errors like `OSError: [Errno 24]`\n"
        "(Worker) ERROR [utils.py:554] ValueError: No common block size for 16\n"
        + "  traceback line\n" * 50
        + "RuntimeError: Engine core initialization failed. See root cause above.\n"
    )
    tail = vs.log_tail(log, lines=3)
    lines = tail.splitlines()
    cause = "cause: (Worker) ERROR [utils.py:554] ValueError: No common block size for 16"
    assert lines[0] == cause
    assert lines[-1].startswith("RuntimeError: Engine core") and len(lines) == 4
    assert vs.log_tail(tmp_path / "missing.log").startswith("(no log: ")


def _spawn(tmp_path: Path, code: str) -> tuple[Replica, subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    return Replica("http://127.0.0.1:1", 1, proc.pid, tmp_path / "log", 0, scratch), proc


def test_stop_terminates_and_cleans_up(tmp_path: Path) -> None:
    replica, proc = _spawn(tmp_path, "import time; time.sleep(60)")
    rp.stop_replica(replica, proc)
    assert proc.returncode is not None and not replica.tmpdir.exists()


def test_stop_kills_a_server_that_ignores_sigterm(tmp_path: Path) -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    replica, proc = _spawn(tmp_path, code)
    time.sleep(0.5)  # let it install the handler
    started = time.monotonic()
    rp.stop_replica(replica, proc, grace_s=0.5)
    assert proc.returncode == -9 and time.monotonic() - started < 10
    assert not processes.pid_alive(replica.pid)


def test_stop_by_record_spares_a_recycled_pid(tmp_path: Path) -> None:
    # A pid file whose pid now belongs to something else: leave that process alone.
    replica, proc = _spawn(tmp_path, "import time; time.sleep(60)")
    try:
        rp.stop_replica(replica)
        assert proc.poll() is None and not replica.tmpdir.exists()
    finally:
        proc.kill()
        proc.wait()


def test_tree_rss_counts_the_process(tmp_path: Path) -> None:
    assert processes.tree_rss_bytes(os.getpid()) > 10 * 2**20


def test_cli_status_and_stop_without_records(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert rp.main(["--run-dir", str(tmp_path), "status"]) == 0
    assert "no replicas recorded" in capsys.readouterr().out
    assert rp.main(["--run-dir", str(tmp_path), "stop"]) == 0


def test_cli_start_reports_errors_cleanly(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    args = ["--run-dir", str(tmp_path), "start", "-n", "1", "--model-dir", str(tmp_path / "x")]
    assert rp.main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "install.sh" in err
