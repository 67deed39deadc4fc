"""ReFold's fold operators: rules that read, from what an unmodified harness sends, which
steps are finished or stale, and claim them for folding.

An operator sees every step once, as it arrives (``observe``), keeps its own per-session
state (``start``), and answers with claims: this step may be folded, standing for it this
one line in the harness's own words. ReFold does the rest for every operator alike
(``gateway.fold.folds``): a claimed step is folded only at a chunk boundary, only when
the saving pays for the re-prefill, never while a later message refers to it
(``gateway.fold.references``), never while a stub names it, and the model can restore it
byte for byte. A session whose model restores ``STRIKES`` folds of one operator stops
that operator (``ReFold``): the rule is wrong for that agent.

Adding an operator is one module defining a ``FoldOperator`` and calling ``register`` at
import, and one import line in ``gateway.fold``. Operators are pure: the same steps give
the same claims.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from gateway.transcript import ToolCall

# Restored folds of one operator after which a session stops applying it: one restore can
# be a need that came up late (a log read again to quote it); two mean the rule misjudges
# what this agent keeps using.
STRIKES = 2


@dataclass(frozen=True, slots=True)
class StepView:
    """What an operator sees of one step: its number, history position, the call that
    produced it (tool-calling harnesses) or the reply whose action did (text actions),
    and the output text as the harness sent it."""

    step: int
    pos: int
    call: ToolCall | None
    action: str | None
    text: str


@dataclass(frozen=True, slots=True)
class FoldClaim:
    """Step ``step`` may be folded to ``note``.

    ``after``: the history position after which a message that quotes the step counts as
    referring to it (earlier ones were written while it was current). ``fresh``: the step
    whose output superseded it, if any: a line that output shows again is no reference to
    the stale one."""

    step: int
    note: str
    after: int
    fresh: int | None = None


class FoldOperator(ABC):
    """One rule. ``name`` is what the replay and the inspector report it by."""

    name: ClassVar[str]

    @abstractmethod
    def start(self) -> Any:
        """A new session's state."""

    @abstractmethod
    def observe(self, state: Any, view: StepView) -> list[FoldClaim]:
        """Take the next step into ``state``; the claims it makes (on earlier steps)."""


_REGISTERED: dict[str, FoldOperator] = {}


def register(operator: FoldOperator) -> FoldOperator:
    """Add ``operator`` under its name (once: a second registration of a name is an error)."""
    if operator.name in _REGISTERED:
        raise ValueError(f"fold operator {operator.name!r} is registered twice")
    _REGISTERED[operator.name] = operator
    return operator


def registered() -> tuple[FoldOperator, ...]:
    """The registered operators, in registration order."""
    return tuple(_REGISTERED.values())
