"""Broker follow-ups over the wire and as a process: store damage at start-up, W2
permissions inside a vhost, Q5 long polling by basic.get, channel.flow."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from gateway.broker import Broker, BrokerConfig
from semantics.clock import ManualClock
from semantics.store.files import segment_name

ROOT = Path(__file__).resolve().parents[2]


def _serve(data_dir: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", "0",
                             "--data-dir", str(data_dir), *extra],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True)


def _three_batches(data_dir: Path) -> list[int]:
    """A data dir whose journal holds three batches (three durable queues, one sync each);
    returns where each batch ends."""
    async def write() -> list[int]:
        b = await Broker.open(str(data_dir), clock=ManualClock(), config=BrokerConfig(fsync=False))
        ends = []
        for name in ("qa", "qb", "qc"):
            b.vhost("/").declare_queue(None, name, passive=False, durable=True, exclusive=False,
                                       auto_delete=False, arguments=None)
            b.sync_now()
            ends.append(os.path.getsize(data_dir / segment_name(1)))
        await b.close()
        return ends
    return asyncio.run(write())


def test_corrupt_store_is_one_line_naming_the_file_and_salvage(tmp_path: Path) -> None:
    """semantics.store StoreCorruptError: a flipped byte in the middle batch of the journal
    (confirmed data) makes `cmq-gateway serve` exit 3 with one line naming the file, the
    damaged range and --salvage; nothing changes on disk. With --salvage it starts, logs
    store.recovery with the bytes set aside, and the other two queues are back."""
    ends = _three_batches(tmp_path)
    seg = tmp_path / segment_name(1)
    raw = bytearray(seg.read_bytes())
    at = (ends[0] + ends[1]) // 2
    raw[at] ^= 0xFF
    seg.write_bytes(bytes(raw))
    before = sorted(os.listdir(tmp_path))

    proc = _serve(tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"cmq-gateway: store damaged: {seg}: damaged durable data at offset "
                               f"{ends[0]}..{ends[1]} (")
    assert lines[0].endswith("); nothing was changed on disk; restart with --salvage (or salvage: true "
                             "in the config) to keep every record that verifies and set the damaged "
                             "bytes aside")
    assert "Traceback" not in err
    assert sorted(n for n in os.listdir(tmp_path) if n != "audit") == before  # audit/: the audit log

    proc = _serve(tmp_path, "--salvage")
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "listening on" in line:
            break
    proc.terminate()
    proc.communicate(timeout=60)
    recovery = [ln for ln in seen if "store.recovery" in ln]
    assert len(recovery) == 1
    assert f" set_aside_bytes={ends[1] - ends[0]} " in recovery[0]
    assert recovery[0].rstrip().endswith(" damaged=1")

    async def reopen() -> list[str]:
        b = await Broker.open(str(tmp_path), clock=ManualClock(), config=BrokerConfig(fsync=False))
        names = sorted(b.vhosts["/"].queues)
        await b.close()
        return names
    assert asyncio.run(reopen()) == ["qa", "qc"]
