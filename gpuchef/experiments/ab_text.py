"""The text of an A/B's results: two results blocks side by side (:func:`side_by_side`) and the
B − A table with its spread and verdict (:func:`format_deltas`) — what `gpuchef ab` prints, over
the hosted engine or HTTP alike."""

from __future__ import annotations

import math

from ..probes.ab import FAILED_ROW, NOT_ENOUGH, Comparison

LABEL_W = 40
COL_W = 16


def _split_row(line: str) -> tuple[str, str] | None:
    """A results-block row ``"{:<40} {value}"`` as (label, value); None for a header line
    (``===…`` / ``---title---``). A row with an empty value (its trailing spaces stripped) is
    a row with value "", not a header."""
    if len(line) > LABEL_W and line[LABEL_W] == " " and line[:LABEL_W].rstrip().endswith(":"):
        return line[:LABEL_W].rstrip(), line[LABEL_W + 1:].strip()
    if len(line) <= LABEL_W and line.endswith(":") and not line.startswith(("=", "-")):
        return line, ""
    return None


def side_by_side(block_a: str, block_b: str, title: str, heads: tuple[str, str] = ("A", "B")) -> str:
    """Merge two ``format_results_block`` texts into one with two value columns. Rows are
    matched by label (a row only one block has shows "" in the other column); section headers
    are re-centred to the wider block. The value columns are COL_W wide, or wider when a value
    needs it (two spaces at least between columns)."""
    vals = [r[1] for blk in (block_a, block_b) for r in map(_split_row, blk.splitlines()) if r]
    col = max([COL_W, *(len(v) + 2 for v in vals)])
    width = LABEL_W + 1 + 2 * col
    rows_b: dict[tuple[str, str], str] = {}
    section = ""
    for line in block_b.splitlines():
        r = _split_row(line)
        if r is None:
            section = line.strip("=- ")
        else:
            rows_b[(section, r[0])] = r[1]
    out = ["{s:=^{n}}".format(s=f" {title} ", n=width),
           "{:<{w}} {:>{c}}{:>{c}}".format("", heads[0], heads[1], w=LABEL_W, c=col)]
    section = ""
    lines = block_a.splitlines()
    for i, line in enumerate(lines):
        r = _split_row(line)
        if r is None:
            section = line.strip("=- ")
            if i == 0:
                continue  # title: replaced above
            if not section:
                out.append(line[0] * width if line else line)
            else:
                out.append("{s:{c}^{n}}".format(s=section, c=line[0], n=width))
            continue
        vb = rows_b.pop((section, r[0]), "")
        out.append("{:<{w}} {:>{c}}{:>{c}}".format(r[0], r[1], vb, w=LABEL_W, c=col).rstrip())
    return "\n".join(out)


def _num(v: float, digits: int = 2) -> str:
    if v is None or not math.isfinite(v):
        return "n/a"
    return f"{v:.{digits}f}"


def format_deltas(cmp: Comparison, unit_name: str = "repetition") -> str:
    """The B − A table. Pooled columns (A, B, B − A, %): each setting's counted windows as one
    set of requests and steps. Per-window columns: the median and the min..max of the paired
    deltas B_n − A_n, computed from the same windows. Then the verdict (``probes.ab.verdict``).
    The first row counts failed requests; when A's and B's shares of failed requests differ the
    judged rows read "not comparable" and a line under the table says why
    (``Comparison.not_comparable``)."""
    na, nb = cmp.count("A"), cmp.count("B")
    plural = lambda n: f"{n} {unit_name}{'s' if n != 1 else ''}"  # noqa: E731
    head = (f" B − A: pooled over {plural(na)} of A and {plural(nb)} of B; "
            f"per {unit_name}: {min(na, nb)} pairs ")
    fmt = "{:<32}{:>11}{:>11}{:>11}{:>9} │{:>11}{:>21}  {:<13}"
    width = 32 + 11 * 3 + 9 + 2 + 11 + 21 + 2 + 13
    lines = ["{s:-^{n}}".format(s=head, n=width),
             fmt.format("", "pooled", "", "", "", f"per {unit_name}", "", ""),
             fmt.format("metric", "A", "B", "B − A", "%", "median Δ", "Δ min..max", "verdict")]
    short = False
    for r in cmp.rows:
        nd = 0 if r.key == FAILED_ROW else 2  # a count
        lo, hi = r.spread
        spread = f"{_num(lo, nd)}..{_num(hi, nd)}" if math.isfinite(lo) else "—"
        med = r.median_delta
        pct = f"{r.delta_pct:+.1f}%" if math.isfinite(r.delta_pct) else "n/a"
        delta = f"{r.delta:+.{nd}f}" if math.isfinite(r.delta) else "n/a"
        v = r.verdict
        if v.startswith(NOT_ENOUGH):  # the run is over: no "yet" about it
            v, short = "no verdict" + v[len(NOT_ENOUGH):], True
        lines.append(fmt.format(r.label[:31], _num(r.a, nd), _num(r.b, nd), delta, pct,
                                f"{med:+.{nd}f}" if math.isfinite(med) else "—", spread,
                                v).rstrip())
    lines.append("-" * width)
    if cmp.not_comparable:
        lines.append(f"Not comparable: {cmp.not_comparable}.")
    lines.append(f"Pooled: all counted {unit_name}s of a setting as one set (a P99 of the pooled "
                 f"requests need not lie among the\n"
                 f"per-{unit_name} P99s). Per {unit_name}: "
                 f"B_n − A_n of each pair. Verdict: B better/worse when the means of the\n"
                 f"{unit_name}s differ by more than either setting's range and every pair agrees; "
                 f"it needs {cmp.min_pairs} pairs.")
    if short:
        lines.append(f"No verdict: {min(na, nb)} pair(s) of {unit_name}s, a verdict needs "
                     f"{cmp.min_pairs}" + (f" (--repetitions {cmp.min_pairs} or more)"
                                           if unit_name == "repetition" else
                                           " (a longer run, or shorter --window)") + ".")
    if cmp.skipped:
        lines.append("Not counted: " + "; ".join(f"{r.name} ({r.why})" for r in cmp.skipped[:6])
                     + (" …" if len(cmp.skipped) > 6 else ""))
    return "\n".join(lines)
