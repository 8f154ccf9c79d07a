"""What re-timing a run's rows answers (benches/sweep/retime.py's Retimer, read by the
gate in roofline/gate/runs.py): each row's fresh samples, one list per round that timed
it, and the rows it left out with why (the time bound it was given ran out before them,
or an interrupt came)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from contract.schema import RowKey


@dataclass(eq=False)  # compared as the Mapping it is: {key: rounds}
class Retimed(Mapping[RowKey, list[list[float]]]):
    """{row key: [samples of each round that timed it]} (a Mapping, as the gate's plain
    re-timing callbacks answer), with `left_out`: {row key: why it was not re-timed},
    `budget_s`: the time bound it was given (None: none), and `interrupted`: whether a
    SIGINT ended it early (what it had timed is kept)."""

    rounds: dict[RowKey, list[list[float]]] = field(default_factory=dict)
    left_out: dict[RowKey, str] = field(default_factory=dict)
    budget_s: float | None = None
    interrupted: bool = False

    def __getitem__(self, key: RowKey) -> list[list[float]]:
        return self.rounds[key]

    def __iter__(self) -> Iterator[RowKey]:
        return iter(self.rounds)

    def __len__(self) -> int:
        return len(self.rounds)
