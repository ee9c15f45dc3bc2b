"""The Run section's facts of a trace, as text: what its meta says of the model, the GPUs, the
load and the scheduler, one row per fact (``run_table``: a column per trace). Meta fields a
trace lacks or a hand edit broke read "?" or "not recorded", never an exception."""

from __future__ import annotations

from typing import Any, Sequence

from .data import TraceView, capacity_probes, part_start_rate


#: what an attached trace's meta named the model before /v1/models was asked (older traces)
_UNNAMED = "(server's model)"


def _server_models(meta: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(URL, what its GET /v1/models said) of an attached trace's servers (meta
    ``server_models``, written by `top --attach` and `ab` over HTTP); [] for other traces.
    Entries that are not objects are left out (a hand-edited trace: the fields read "?")."""
    sm = meta.get("server_models")
    if not isinstance(sm, dict):
        return []
    return [(str(u), d) for u, d in sm.items() if isinstance(d, dict)]


def _served_text(meta: dict[str, Any], notes: bool) -> str:
    """The Model row of an attached trace from its servers' /v1/models: the id with its root and
    owned_by, e.g. "tiny-served (root tiny, owned_by gpuchef; GET /v1/models)"; "?" where the
    server did not say, with its note once (``notes``). "" when the meta has none."""
    servers = _server_models(meta)
    m = meta.get("model")
    sent = m.get("name") if isinstance(m, dict) else None  # the name the load sent, if any
    parts = []
    for url, d in servers:
        name = d.get("id") if isinstance(d.get("id"), str) else None
        name = name or (sent if isinstance(sent, str) and sent != _UNNAMED else None) or "?"
        extra = [f"{k} {d[k]}" for k in ("root", "owned_by")
                 if isinstance(d.get(k), str) and d[k] != name]
        t = name + (f" ({', '.join(extra)}; GET /v1/models)" if extra else "")
        if notes and isinstance(d.get("note"), str) and d["note"]:
            t += f" — {d['note']}"
        parts.append(f"{url}: {t}" if len(servers) > 1 else t)
    return "; ".join(parts)


def _served_max_len(meta: dict[str, Any]) -> str:
    """max_model_len as each attached server's /v1/models said it ("?" where it did not)."""
    servers = _server_models(meta)
    vals = [(u, d.get("max_model_len")) for u, d in servers]
    vals = [(u, str(v) if isinstance(v, int) and not isinstance(v, bool) else "?")
            for u, v in vals]
    if len(vals) == 1:
        return vals[0][1]
    return ", ".join(f"{u}: {v}" for u, v in vals) or "?"


def model_text(meta: dict[str, Any], notes: bool = True) -> str:
    served = _served_text(meta, notes)
    if served:
        return served
    m = meta.get("model")
    if isinstance(m, dict):
        s = str(m.get("name", "?"))
        if m.get("random_weights"):
            s += " (random weights)"
        if m.get("num_params"):
            s += f", {m['num_params'] / 1e9:.2f} B params" if m["num_params"] >= 1e9 else \
                f", {m['num_params'] / 1e6:.1f} M params"
        if m.get("dtype"):
            s += f", {m['dtype']}"
        return s
    return str(m) if m is not None else "not recorded"


def gpus_text(meta: dict[str, Any]) -> str:
    g = meta.get("gpus")
    if isinstance(g, dict) and g:
        return ", ".join(f"{k}: {v}" for k, v in g.items())
    return "none recorded"


#: The Load row's words for the A/B load of two servers (``meta.ab.load``, gpuchef ab over HTTP)
AB_LOAD_TEXT = {
    "mirrored": "mirrored — every request sent to both servers at the same arrival time "
                "(request ids A/… and B/…)",
    "sequential": "sequential — the whole load to one side at a time, repetitions alternating"}


def _load_text(meta: dict[str, Any]) -> str:
    w = meta.get("workload")
    ab_load = (meta.get("ab") or {}).get("load") if isinstance(meta.get("ab"), dict) else None
    if not isinstance(w, dict):
        ld = meta.get("load")  # a client's load (bench --base-url, top --attach, ab over HTTP)
        if not isinstance(ld, dict) or not ld.get("desc"):
            return "not recorded"
        per = " per run" if ab_load in AB_LOAD_TEXT else ""  # each side, each repetition
        s = (f"{ld['desc']}; {ld.get('num_requests', '?')} requests{per} to "
             f"{ld.get('endpoint', '?')} (gpuchef's HTTP client)")
        if ab_load in AB_LOAD_TEXT:
            s += f"; A/B load {AB_LOAD_TEXT[ab_load]}"
        return s
    if w.get("dataset") == "random":
        s = (f"random, {w.get('request_rate')} req/s ({w.get('arrival')}, burstiness "
             f"{w.get('burstiness')}), input {w.get('input_len')} / output {w.get('output_len')} "
             f"tokens (range ratio {w.get('range_ratio')})")
    else:
        s = f"{w.get('dataset')} replayed at {w.get('trace_speed')}×"
    if w.get("num_prompts") is not None:
        s += f", {w['num_prompts']} requests"
    if w.get("duration_s") is not None:
        s += f", {w['duration_s']:g} s of arrivals"
    clip = [f"{k.replace('_', ' ')} {w[k]}" for k in ("max_input_len", "max_output_len")
            if w.get(k) is not None]
    if clip:
        s += "; " + ", ".join(clip)
    if w.get("probe_interval_s"):
        s += f"; probes every {w['probe_interval_s']} s"
    return s + f"; seed {w.get('seed')}"


def _capacity_load_text(view: TraceView) -> str:
    """The Load row of a ``gpuchef ab --capacity`` trace: a search over the rate, each probe's
    offered rate (``capacity_probes``: what the Capacity section shows), then the workload's
    shape without the meta's one rate (that is only --rate-lo's)."""
    probes, _ = capacity_probes(view)
    by: dict[str, list[str]] = {}
    for p in probes:
        by.setdefault(p.label, []).append(f"{p.rate:.3g}")
    rates = "; ".join(f"{k} {', '.join(v)}" for k, v in by.items()) or "none recorded"
    w = view.meta.get("workload")
    shape = ""
    if isinstance(w, dict):
        shape = (f"random arrivals ({w.get('arrival')}, burstiness {w.get('burstiness')}), input "
                 f"{w.get('input_len')} / output {w.get('output_len')} tokens"
                 if w.get("dataset") == "random" else f"{w.get('dataset')} replayed")
        if w.get("duration_s") is not None:
            shape += f", {w['duration_s']:g} s of arrivals per probe"
        shape += f"; seed {w.get('seed')}"
    return (f"capacity search: probes offered {rates} req/s (in the order run)"
            + (f"; {shape}" if shape else ""))


def _sched_text(meta: dict[str, Any]) -> str:
    ec = meta.get("engine_config") or meta.get("config") or {}
    sc = ec.get("scheduler") if isinstance(ec, dict) else None
    if not isinstance(sc, dict):
        return "not recorded"
    return ", ".join(f"{k}={v}" for k, v in sc.items())


def _part_load(view: TraceView, views: Sequence[TraceView]) -> str:
    """The Load row's addition for a later part of a session: the rate in force when it began
    (the meta's workload is the session's start)."""
    part = view.meta.get("part")
    if not isinstance(part, int) or part < 2:
        return ""
    rate, where = part_start_rate(view, views)
    if rate is not None:
        return (f" — the session's start; part {part} began at {rate} (the last rate change "
                f"before it, in {where})")
    if where:
        return (f" — the session's start; part {part} began later, at the rate set in an "
                f"earlier part: {where}")
    return f" — the session's start, still in force when part {part} began"


def run_table(views: Sequence[TraceView]) -> tuple[list[str], list[list[str]]]:
    """The Run section's table: a column per trace, a row per fact, rows matched by their label
    (a fact only some traces have — A/B settings, a part — is blank for the others, never a
    shifted column)."""
    per = [dict(_run_rows(v, views)) for v in views]
    labels: list[str] = []
    for v in views:
        for k, _ in _run_rows(v, views):
            if k not in labels:
                labels.append(k)
    return ["", *[v.name for v in views]], [[k, *[p.get(k, "") for p in per]] for k in labels]


def _run_rows(view: TraceView, views: Sequence[TraceView] = ()) -> list[tuple[str, str]]:
    meta, tr = view.meta, view.trace
    v = meta.get("versions") or {}
    host = meta.get("host") or {}
    # a client's trace of a server gpuchef did not host: no device, KV cache or steps in it
    remote = isinstance(meta.get("source"), dict) and meta["source"].get("kind") == "attached" \
        and "kv_blocks" not in meta
    rows = [
        ("File", str(view.path.name)),
        ("Recorded", str(meta.get("created", "?"))),
        ("Command", f"gpuchef {meta.get('command', '?')}"),
        ("Model", model_text(meta)),
        ("Device / attention", f"{meta.get('device', '?')} / {meta.get('attention_backend', '?')}"
         if not remote else "the server's (not seen from its client)"),
        ("GPUs", gpus_text(meta)),
        ("Scheduler at start", _sched_text(meta) if not view.capacity else
         "each probe runs its setting (A/B settings below)"),
        ("KV cache", f"{meta.get('kv_blocks', '?')} blocks × {meta.get('block_size', '?')} tokens; "
                     f"max_model_len {meta.get('max_model_len', '?')}" if not remote else
         "the server's (not seen from its client)" + (
             f"; max_model_len {_served_max_len(meta)} (GET /v1/models)"
             if _server_models(meta) else "")),
        ("Load", _capacity_load_text(view) if view.capacity else
         _load_text(meta) + _part_load(view, views)),
    ]
    part = meta.get("part")
    if isinstance(part, int) and part > 1:
        rows.insert(2, ("Part", f"{part} of session {meta.get('session_id', '?')}"
                                + (f" (after {meta['previous_part']})"
                                   if isinstance(meta.get("previous_part"), str) else "")))
    if view.ab or view.capacity:
        rows.append(("A/B settings", "; ".join(f"{k}: {s}" if s else k for k, s in view.settings.items())))
    rows += [
        ("Versions", ", ".join(f"{k} {val}" for k, val in v.items() if val)),
        ("Host", f"{host.get('hostname', '?')} ({host.get('platform', '?')})"),
        ("Records", f"{len(tr.steps):,} steps, {len(tr.requests):,} requests, "
                    f"{len(tr.gpu_samples):,} GPU samples, {len(tr.host_samples):,} host samples, "
                    f"{len(tr.events):,} events"),
        ("Complete", "yes (end record present)" if tr.complete
         else "no — cut short, or still being written (no end record)"),
        ("Duration", f"{view.t(view.end_ns):.2f} s from the first record to the last"),
    ]
    return rows
