"""The load's files: the bundled trace datasets, the trace CSV reader, and the number checks
the load's configs share (``workload.WorkloadConfig``, ``phases``' phase files), below both so
that neither imports the other for them."""

from __future__ import annotations

import calendar
import csv
import gzip
import math
import re
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ConfigError

DATA_DIR = Path(__file__).resolve().parent / "data"
#: the bundled phased workloads (``phases.BUNDLED_WORKLOADS``: name → file)
WORKLOADS_DIR = DATA_DIR / "workloads"

#: Named trace datasets bundled with gpuchef (name -> file under ``engine_host/vocab/data``).
BUNDLED_DATASETS: dict[str, str] = {"azure-conv": "azure_conv.csv.gz"}
TRACE_COLUMNS: tuple[str, ...] = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
#: Sanity cap on the number of requests one workload may hold.
MAX_REQUESTS = 1_000_000
#: A trace timestamp may step back by this much (s) — rounding in the source — and is then
#: clamped to the previous one; more than that is an error.
BACKWARDS_TOLERANCE_S = 1e-3


def _num(name: str, value: Any, *, allow_inf: bool = False) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {value!r}") from None
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        # with inf allowed, only NaN lands here: "finite" would contradict the inf it takes
        what = "a number (inf allowed), not NaN" if allow_inf else "a finite number"
        raise ConfigError(f"{name} must be {what}, got {value!r}")
    return v


def _int(name: str, value: Any, lo: int, hi: int | None = None) -> int:
    rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be an integer {rng}, got {value!r}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise ConfigError(f"{name} must be an integer {rng}, got {value!r}") from None
    if not isinstance(value, (int, np.integer)):
        raise ConfigError(f"{name} must be an integer {rng}, got {value!r}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        raise ConfigError(f"{name}={value} is out of range: allowed {rng}")
    return value


def dataset_path(name: str) -> Path:
    """The CSV file of a trace dataset: a bundled name ("azure-conv") or a path to a file.

    Raises ConfigError for "random" (it has no file), for an unknown name (listing the allowed
    ones), or for a path that is not an existing file.
    """
    key = str(name).strip()
    if key in BUNDLED_DATASETS:
        return DATA_DIR / BUNDLED_DATASETS[key]
    if key == "random":
        raise ConfigError("dataset 'random' is generated, it has no file")
    p = Path(key).expanduser()
    looks_like_path = (p.name.lower().endswith((".csv", ".csv.gz")) or "/" in key
                       or "\\" in key or p.exists())
    if not looks_like_path:
        workloads = [q.stem for q in sorted(WORKLOADS_DIR.glob("*.yaml"))]
        raise ConfigError(f"--dataset {name!r} is not known: use one of "
                          f"{', '.join(('random', *BUNDLED_DATASETS, *workloads))}, a path to a CSV "
                          f"file ({', '.join(TRACE_COLUMNS)}) or a workload .yaml file")
    if not p.is_file():
        raise ConfigError(f"--dataset {name!r}: no such file")
    return p


# ---------------------------------------------------------------------------------------------
# Trace CSV

_DT_RE = re.compile(
    r"(\d{4})-(\d{1,2})-(\d{1,2})[ T](\d{1,2}):(\d{1,2}):(\d{1,2})(?:[.,](\d+))?"
    r"\s*(Z|[+-]\d{2}:?\d{2})?")


def _parse_timestamp(text: str) -> tuple[str, int, float]:
    """("datetime"|"seconds", whole seconds, fraction). Raises ValueError.

    Datetimes are parsed by hand because the Azure trace has 7 fractional digits, which
    ``datetime.fromisoformat`` rejects before Python 3.11. A datetime without a zone is taken
    as UTC: only differences matter, and UTC has no DST jumps.
    """
    s = text.strip()
    m = _DT_RE.fullmatch(s)
    if m:
        y, mo, d, h, mi, sec = (int(g) for g in m.groups()[:6])
        datetime(y, mo, d, h, mi, sec)  # range check (month 13, hour 25, ...)
        whole = calendar.timegm((y, mo, d, h, mi, sec, 0, 0, 0))
        frac = float("0." + m.group(7)) if m.group(7) else 0.0
        tz = m.group(8)
        if tz and tz != "Z":
            sign = 1 if tz[0] == "+" else -1
            hh, mm = int(tz[1:3]), int(tz[-2:])
            whole -= sign * (hh * 3600 + mm * 60)
        return "datetime", whole, frac
    v = float(s)  # ValueError for anything else
    if not math.isfinite(v):
        raise ValueError("not finite")
    whole = math.floor(v)
    return "seconds", int(whole), v - whole


def _parse_len(text: str) -> int:
    s = text.strip()
    try:
        return int(s)
    except ValueError:
        v = float(s)  # "374.0" is fine; "abc" raises ValueError
        if not v.is_integer():
            raise ValueError("not an integer") from None
        return int(v)


def load_trace_csv(path: str | Path) -> list[tuple[float, int, int]]:
    """Read a trace CSV (or a gzip-compressed one, ``*.csv.gz``) into ``[(arrival_s,
    context_tokens, generated_tokens), ...]``.

    Format (the Azure LLM inference trace's): a header with ``TIMESTAMP``, ``ContextTokens``,
    ``GeneratedTokens`` (any order, case-insensitive; extra columns ignored), one row per request.
    ``TIMESTAMP`` is a datetime (``2023-11-16 18:15:46.6805900``, any number of fractional digits,
    optional ``T`` and zone) or a number of seconds; all rows must use the same form.
    ``arrival_s`` is seconds since the first row (not time-scaled). Blank lines are skipped.

    Raises ConfigError naming the file, the line number and the problem for: a missing file, an
    empty file or one with no data rows, a header without the expected columns, a row with the
    wrong number of fields, a non-numeric or non-integer field, a length < 1, or a timestamp that
    goes back by more than ``BACKWARDS_TOLERANCE_S`` (smaller steps back are clamped).
    """
    p = Path(path)
    try:
        st = p.stat()
    except OSError as e:
        raise ConfigError(f"trace file {str(p)!r}: cannot read it ({e.strerror or e})") from None
    return list(_load_trace_cached(str(p.resolve()), st.st_mtime_ns, st.st_size))


@lru_cache(maxsize=4)
def _load_trace_cached(path: str, _mtime_ns: int, _size: int) -> tuple[tuple[float, int, int], ...]:
    # Cached on (path, mtime, size): an A/B run reads the same 19k-row file twice.
    where = f"trace file {path!r}"
    try:
        # a gzip-compressed CSV (name ending .gz) is read as the CSV it holds
        f = (gzip.open(path, "rt", newline="", encoding="utf-8-sig") if path.endswith(".gz")
             else open(path, newline="", encoding="utf-8-sig"))
    except OSError as e:
        raise ConfigError(f"{where}: cannot read it ({e.strerror or e})") from None
    with f:
        reader = csv.reader(f)
        numbered = []  # (line number, fields), blank lines left out
        try:
            for row in reader:
                if any(c.strip() for c in row):
                    numbered.append((reader.line_num, row))
        except (csv.Error, UnicodeDecodeError, OSError, EOFError) as e:
            raise ConfigError(f"{where}, line {reader.line_num + 1}: not readable as CSV "
                              f"({e})") from None
    expected = ", ".join(TRACE_COLUMNS)
    if not numbered:
        raise ConfigError(f"{where} is empty: expected a header line {expected} and one row "
                          "per request")
    hline, header = numbered[0]
    names = [h.strip().lower() for h in header]
    col = {}
    for want in TRACE_COLUMNS:
        if want.lower() not in names:
            raise ConfigError(f"{where}, line {hline}: bad header {','.join(header)!r}: "
                              f"expected the columns {expected}")
        col[want] = names.index(want.lower())
    if len(numbered) == 1:
        raise ConfigError(f"{where} has a header but no requests")

    out: list[tuple[float, int, int]] = []
    kind0 = whole0 = frac0 = None
    prev = -math.inf
    for line, row in numbered[1:]:
        if len(row) != len(header):
            raise ConfigError(f"{where}, line {line}: expected {len(header)} fields "
                              f"({','.join(h.strip() for h in header)}), got {len(row)}: "
                              f"{','.join(row)!r}")
        raw_ts = row[col["TIMESTAMP"]]
        try:
            kind, whole, frac = _parse_timestamp(raw_ts)
        except ValueError:
            raise ConfigError(f"{where}, line {line}: TIMESTAMP {raw_ts.strip()!r} is neither a "
                              "datetime (YYYY-MM-DD HH:MM:SS[.fff]) nor a number of seconds") from None
        if kind0 is None:
            kind0, whole0, frac0 = kind, whole, frac
        elif kind != kind0:
            raise ConfigError(f"{where}, line {line}: TIMESTAMP {raw_ts.strip()!r} is a {kind} "
                              f"value but the first row's is a {kind0} value")
        t = (whole - whole0) + (frac - frac0)
        if t < prev - BACKWARDS_TOLERANCE_S:
            raise ConfigError(f"{where}, line {line}: TIMESTAMP {raw_ts.strip()!r} goes back "
                              f"{prev - t:.6f} s from the previous row: rows must be in time order")
        t = max(t, prev)
        prev = t
        lens = []
        for name in ("ContextTokens", "GeneratedTokens"):
            raw = row[col[name]]
            try:
                n = _parse_len(raw)
            except ValueError:
                raise ConfigError(f"{where}, line {line}: {name} {raw.strip()!r} is not an "
                                  "integer number of tokens") from None
            if n < 1:
                raise ConfigError(f"{where}, line {line}: {name} {n} is out of range: "
                                  "allowed >= 1 token")
            lens.append(n)
        out.append((round(t, 9), lens[0], lens[1]))  # ns: drops float noise of the subtraction
    return tuple(out)
