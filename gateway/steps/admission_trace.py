"""Admission trace: one JSON line per working-set admission event, with the state the
decision read, for finding out why a request waited (``GatewayConfig.admission_trace``).

Each line: ``t`` (wall clock, to join the client's request log), ``event`` (``decide``: a
request asked, ``because`` it ``arrived``, its ``timer`` fired or the state ``changed``;
``ended``; ``moved``: another replica accepted it; ``withdrawn``: it waits no more without
going, ``why``), the session (``tenant/session``), the replica, the event's own fields (a
decision's ``verdict``, ``retry_in_s``, ``waited_s``, ``tokens``, ``room``: the pool and
what its running requests use) and ``state``: that replica's members, queue and roaming
waiters just after the event (``WorkingSetAdmission.describe``; a refused request is in
the queue, an admitted one joins the members as it starts). Lines name sessions: the file
is the operator's, like the store.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from router.working_set_admission import WorkingSetAdmission
from store import foldgate_home


def trace_path(configured: str) -> Path:
    """The trace file: ``configured`` as given when absolute, else under foldgate's home
    (``$FOLDGATE_HOME``, else ``~/.foldgate``), beside the embedded store."""
    path = Path(configured).expanduser()
    return path if path.is_absolute() else foldgate_home() / path


class AdmissionTrace:
    def __init__(
        self,
        path: Path,
        admission: WorkingSetAdmission,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", buffering=1)  # line-buffered: a line is whole or absent
        self.admission = admission
        self.clock = clock
        self.wall = wall

    def write(
        self, event: str, tenant: str, session: str, replica: str | None, **fields: Any
    ) -> None:
        line: dict[str, Any] = {
            "t": round(self.wall(), 3), "event": event, "session": f"{tenant}/{session}",
            "replica": replica, **fields,
        }  # fmt: skip
        if replica is not None:
            line["state"] = self.admission.describe(replica, self.clock())
        self._file.write(json.dumps(line) + "\n")

    def close(self) -> None:
        self._file.close()
