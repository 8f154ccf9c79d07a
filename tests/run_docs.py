"""A run as a RunDoc (contract/schema.py) from the form the files hold it in: the
metadata's JSON object and the rows as dicts or a frame of them, each read through its
one loader (parse_meta, parse_row).  For tests that build a run by hand and hand it to
the readers (summary, figures, targets); the physics check is load_doc's, not applied."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from contract.record import parse_row
from contract.run_meta import RunMeta, meta_json, parse_meta
from contract.schema import RunDoc, load_doc


def doc_of(meta: RunMeta | Mapping[str, Any] | None = None,
           rows: pd.DataFrame | Iterable[Mapping[str, Any]] = ()) -> RunDoc:
    records = rows.to_dict("records") if isinstance(rows, pd.DataFrame) else rows
    typed = meta if isinstance(meta, RunMeta) else parse_meta(meta or {})
    return RunDoc(typed, tuple(parse_row(r) for r in records))


def load_run(path: str | Path) -> tuple[dict[str, Any], pd.DataFrame]:
    """A saved run as (its metadata's JSON object, its rows' frame), both from load_doc
    (the physics check applied): for tests that read a run by its columns and keys."""
    doc = load_doc(path)
    return meta_json(doc.meta), doc.frame()
