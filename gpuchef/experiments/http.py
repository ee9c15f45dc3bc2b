"""The A/B over HTTP: two settings of one server, or two servers, on the same arrivals —
``gpuchef ab``'s HTTP branch and `top --attach`'s A/B (:class:`AttachAB`), on the core of
``experiments.ab``.

* ``gpuchef ab --base-url URL --a SPEC --b SPEC``: one server with gpuchef's knob endpoint
  (``GET``/``PATCH /gpuchef/v1/scheduler``, `gpuchef serve`); each setting is PATCHed before its
  run; the whole load is sent once per setting per repetition, A B, then B A, …
  (``experiments.ab.sequence``, as the hosted ``ab`` without ``--interleave``).
* ``gpuchef ab --a url=URL1 --b url=URL2``: two servers. ``--ab-load mirrored`` (default): every
  request is sent to both at the same arrival time (one clock, two connection pools);
  ``sequential``: the whole load to A, then to B, repetitions alternating. Knob specs may follow
  ``url=`` (``url=URL1,max_num_batched_tokens=512``) when that server has the knob endpoint.

The load is `bench --base-url`'s (``bench_http.prepare_http_load``, the same flags), sent by
``http_load.run_http_load``; each request as the client saw it becomes a ``RequestRecord``
(``http_load.to_request_records``). The windows, their figures, the pooled results, B − A and the
verdict are ``probes.ab.analyse``'s of the runs' marks — ``ab:1:<A|B>:<n>`` per sequential run,
``ab:1:AB:<n>`` per mirrored repetition (A's and B's window *n* over one span, each holding its
server's requests, ids ``A/…``/``B/…``) — and requests (ids suffixed ``#<rep>``:
``probes.ab.rep_request_id``): the records the trace receives, so
``gpuchef report`` of the trace gives the same table. `top --attach U1 --attach U2` runs the same
:func:`run_ab` for its A/B screen, its marks and requests going to the dashboard's timeline as
they happen (``on_event``/``on_result``).
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..engine_host.vocab.config import AUTO_BUDGET, KNOBS, SchedulerConfig
from ..engine_host.vocab.errors import ConfigError
from ..probes.ab import STEP_ROWS, mark_name
from ..tui.session import ABState
from .ab import mark_event, sequence

AB_LOADS = ("mirrored", "sequential")
#: Shared clock start of a mirrored run: this long after both sessions are opened (s), so that
#: both warm-ups are done before arrival 0.
MIRROR_START_S = 0.25
@dataclass
class Arm:
    """One side: ``label`` "A"/"B", ``url`` the server's base URL, ``spec`` the knob part of
    the spec ("" = none), ``setting`` (``experiments.ab.Setting`` over the server's knob state,
    None when no knob is named), ``server`` the ``client.knobs.KnobEndpoint`` of its server."""

    label: str
    url: str
    spec: str
    setting: Any = None
    server: Any = None
    initial: SchedulerConfig | None = None

    def describe(self) -> str:
        return self.setting.describe() if self.setting is not None else "the server's own settings"


def split_url(spec: str, flag: str) -> tuple[str | None, str]:
    """``url=URL[,KNOB=VALUE...]`` → (URL, the knob part); a spec without ``url=`` → (None, spec).
    Raises ConfigError for ``url=`` given twice or empty."""
    urls, rest = [], []
    for part in str(spec).split(","):
        key, sep, val = part.strip().partition("=")
        if sep and key.strip().lower() == "url":
            urls.append(val.strip())
        else:
            rest.append(part)
    if len(urls) > 1:
        raise ConfigError(f"{flag} {spec!r}: url= is given twice (one server per side)")
    if urls and not urls[0]:
        raise ConfigError(f"{flag} {spec!r}: url= needs a URL, e.g. url=http://127.0.0.1:8000")
    return (urls[0] if urls else None), ",".join(rest).strip(", ")


def is_http(o: dict[str, Any]) -> bool:
    """Whether `ab`'s options ask for the HTTP branch (``--base-url``, or url= in a spec)."""
    try:
        return bool(o.get("base_url")) or any(split_url(o[k], "")[0]
                                              for k in ("spec_a", "spec_b"))
    except ConfigError:  # url= given twice: parse_arms says so, naming the flag
        return True


def parse_arms(o: dict[str, Any]) -> tuple[dict[str, Arm], str]:
    """The two sides and the A/B load (``mirrored``/``sequential``) from ``--base-url``,
    ``--a``/``--b`` and ``--ab-load``. Raises ConfigError: url= with --base-url, url= on one
    side only, a URL given twice, mirrored on one server, a bad URL."""
    from ..client.http_load import normalize_base_url

    ua, ka = split_url(o["spec_a"], "--a")
    ub, kb = split_url(o["spec_b"], "--b")
    base = o.get("base_url")
    load = o.get("ab_load")
    if base and (ua or ub):
        raise ConfigError(f"--base-url {base} and url= in --{'a' if ua else 'b'}: give one — "
                          "--base-url URL compares two knob settings of one server; "
                          "--a url=URL1 --b url=URL2 compares two servers")
    if bool(ua) != bool(ub):
        has, lacks = ("a", "b") if ua else ("b", "a")
        raise ConfigError(f"--{has} names url={ua or ub} but --{lacks} names no url=: give url= "
                          f"on both sides (two servers), or --base-url URL and knob specs "
                          "(one server)")

    def norm(u: str, flag: str) -> str:
        try:
            return normalize_base_url(u)
        except ConfigError as e:
            raise ConfigError(str(e).replace("--base-url", flag)) from None

    if base:
        url = norm(base, "--base-url")
        if load == "mirrored":
            raise ConfigError("--ab-load mirrored sends each request to two servers: with "
                              "--base-url (one server) the runs are sequential (drop --ab-load, "
                              "or give --a url=URL1 --b url=URL2)")
        return {"A": Arm("A", url, ka), "B": Arm("B", url, kb)}, "sequential"
    a, b = norm(ua, "--a url="), norm(ub, "--b url=")
    if a == b:
        raise ConfigError(f"--a and --b both name {a}: two servers need two URLs; to compare two "
                          f"settings of one server use --base-url {a} with knob specs")
    return {"A": Arm("A", a, ka), "B": Arm("B", b, kb)}, load or "mirrored"


def knob_state(arm: Arm, api_key: str | None) -> None:
    """Read ``arm``'s server's knob endpoint when its spec names knobs and parse the spec over
    that state (``experiments.ab.parse_setting``). Raises ConfigError naming the URL and what is
    missing, or the spec's fault."""
    from ..client.knobs import KnobEndpoint
    from .ab import parse_setting

    if not arm.spec:
        return
    srv = KnobEndpoint(arm.url, api_key)
    state = srv.read()
    if state is None:
        raise ConfigError(f"--{arm.label.lower()} {arm.spec!r} sets knobs, but {arm.url} cannot "
                          f"take them: {srv.reason}")
    arm.server, arm.initial = srv, state
    arm.setting = parse_setting(arm.spec, state, arm.label)


def patch_body(cfg: SchedulerConfig) -> dict[str, Any]:
    """Every knob the endpoint takes (mode, ``KNOBS``, ``auto_budget``) from ``cfg``: the whole
    setting, so that B's change does not linger into A's next run."""
    return {"mode": cfg.mode, **{k: getattr(cfg, k) for k in KNOBS if hasattr(cfg, k)},
            AUTO_BUDGET: getattr(cfg, AUTO_BUDGET, "")}


def apply(arm: Arm) -> None:
    """PATCH ``arm``'s setting (no-op without knobs). Raises ConfigError with the server's
    words."""
    if arm.setting is None:
        return
    try:
        arm.server.patch(patch_body(arm.setting.config))
    except ConfigError as e:
        raise ConfigError(f"setting {arm.label} ({arm.describe()}) on {arm.url}: {e}") from None


@dataclass
class HttpRun:
    """One whole load sent to one side: ``label``, ``rep``, ``run`` (``http_load.HttpLoadRun``),
    ``records`` (its RequestRecords), ``t0_ns`` its window start (its mark: arrival 0's clock,
    or an earlier POST)."""

    label: str
    rep: int
    run: Any
    records: list = field(default_factory=list)
    t0_ns: int = 0


def records_of(results: list, prefix: str = "", rep: int = 1, run_id: int = 1) -> list:
    """ClientResults as RequestRecords (``http_load.to_request_records``), each id as
    ``probes.ab.rep_request_id`` spells it for repetition ``rep`` of run ``run_id`` (every
    repetition sends the same ids: the records' stay unique); ``prefix`` ("A/", "B/") before
    it — a mirrored run's trace holds both servers' copies of each request, told apart by it
    (``probes.ab.side_of``). The ids sent (``x-request-id``) are the load's own."""
    from dataclasses import replace

    from ..probes.ab import rep_request_id
    from ..client.http_load import to_request_records

    side = prefix.rstrip("/") or None
    return [replace(r, request_id=rep_request_id(r.request_id, rep, run_id, side))
            for r in to_request_records(results)]


def _as_run(label: str, rep: int, run: Any, t0_ns: int, prefix: str = "",
            run_id: int = 1) -> HttpRun:
    return HttpRun(label, rep, run, records_of(run.results, prefix, rep, run_id), t0_ns)


def _mark(run_id: int, label: str, rep: int | None, t_ns: int) -> Any:
    return mark_event(mark_name(run_id, label, rep), t_ns)


def _run_async(make, cancel) -> Any:
    """``make()``'s coroutine on a fresh event loop, the objects made so far frozen out of the
    garbage collector's way (as ``http_load.run_http_load``); None when ``cancel`` (a
    threading.Event) is set meanwhile — the requests in flight are cancelled."""
    async def main():
        task = asyncio.ensure_future(make())
        while cancel is not None and not task.done():
            if cancel.is_set():
                task.cancel()
                break
            await asyncio.wait({task}, timeout=0.1)
        return await task

    gc.collect()
    gc.freeze()
    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        return None
    finally:
        gc.unfreeze()


def run_sequential(arms: dict[str, Arm], loads: dict[str, Any], reps: int, on_run=None, *,
                   run_id: int = 1, on_event=None, on_result=None, cancel=None
                   ) -> list[HttpRun]:
    """Each side's whole load, in ``ab.run_orders(reps)``; the side's setting PATCHed first;
    request ids ``A/…#<rep>`` and ``B/…#<rep>`` in the records (as the hosted sequential A/B).
    ``on_event(EngineEvent)``: each run's ``ab:<run_id>:<A|B>:<n>`` mark as the run starts (at
    arrival 0's clock); ``on_result(label, rep, RequestRecord)`` for each request as it
    finishes; ``on_run(i, total, HttpRun)`` after each run. ``cancel`` (threading.Event): stop
    at once; the runs finished before are returned."""
    from ..client.http_load import run_http_load_async

    out = []
    for rep, label in sequence(reps):
        if cancel is not None and cancel.is_set():
            return out
        apply(arms[label])
        pl = loads[label]
        t0 = time.monotonic_ns() + int(MIRROR_START_S * 1e9)
        if on_event is not None:
            on_event(_mark(run_id, label, rep, t0))
        cb = None if on_result is None else \
            (lambda r, k=label, n=rep: on_result(k, n, records_of([r], f"{k}/", n, run_id)[0]))
        run = _run_async(lambda: run_http_load_async(pl.specs, pl.cfg, pl.body, ramp=pl.ramp,
                                                     t0_ns=t0, on_result=cb), cancel)
        if run is None:
            return out
        r = _as_run(label, rep, run, t0, prefix=f"{label}/", run_id=run_id)
        out.append(r)
        if on_run is not None:
            on_run(len(out), 2 * reps, r)
    return out


def run_mirrored(arms: dict[str, Arm], loads: dict[str, Any], reps: int, on_run=None, *,
                 run_id: int = 1, on_event=None, on_result=None, cancel=None
                 ) -> list[HttpRun]:
    """Per repetition, the load sent to both servers on one clock: request *i* to A and to B at
    the same ``t0 + arrival_s``; request ids ``A/…#<rep>`` and ``B/…#<rep>``. ``on_event``:
    each repetition's ``ab:<run_id>:AB:<n>`` mark (``probes.ab.MIRRORED``) at its t0; the rest
    as :func:`run_sequential`."""
    from ..probes.ab import MIRRORED
    from ..client.http_load import run_http_load_async

    out = []
    for rep in range(1, reps + 1):
        if cancel is not None and cancel.is_set():
            return out
        for label in ("A", "B"):
            apply(arms[label])
        t0 = time.monotonic_ns() + int(MIRROR_START_S * 1e9)
        if on_event is not None:
            on_event(_mark(run_id, MIRRORED, rep, t0))

        def cb(k: str, n: int):
            if on_result is None:
                return None
            return lambda r: on_result(k, n, records_of([r], f"{k}/", n, run_id)[0])

        async def both(t0=t0, rep=rep):
            return await asyncio.gather(*(run_http_load_async(
                loads[k].specs, loads[k].cfg, loads[k].body, ramp=loads[k].ramp, t0_ns=t0,
                on_result=cb(k, rep)) for k in ("A", "B")))

        got = _run_async(both, cancel)
        if got is None:
            return out
        for label, run in zip(("A", "B"), got):
            out.append(_as_run(label, rep, run, t0, prefix=f"{label}/", run_id=run_id))
            if on_run is not None:
                on_run(len(out), 2 * reps, out[-1])
    return out


def run_ab(load: str, arms: dict[str, Arm], loads: dict[str, Any], reps: int, on_run=None,
           **kw: Any) -> list[HttpRun]:
    """:func:`run_mirrored` or :func:`run_sequential` by ``load`` ("mirrored"/"sequential")."""
    return (run_mirrored if load == "mirrored" else run_sequential)(arms, loads, reps, on_run,
                                                                   **kw)


def end_mark(runs: list[HttpRun], run_id: int = 1, now_ns: int | None = None) -> Any:
    """The ``ab:<run_id>:end`` mark just after the last activity of ``runs`` (its last token,
    or the end of its last run), or at ``now_ns`` when later (a run stopped early)."""
    end = max((t for r in runs for q in r.records for t in q.token_times_ns[-1:]),
              default=max((r.t0_ns for r in runs), default=0))
    end = max([end, *(r.run.t0_ns + int(r.run.duration_s * 1e9) for r in runs)]) + 1
    return _mark(run_id, "end", None, max(end, now_ns or 0))


def marks(runs: list[HttpRun], load: str, run_id: int = 1) -> list[Any]:
    """The marks of ``runs`` as :func:`run_ab` sent them (each run's, or each repetition's
    ``AB`` mark when mirrored, at its window start) and :func:`end_mark` after the last."""
    from ..probes.ab import MIRRORED

    if load == "mirrored":
        ev = [_mark(run_id, MIRRORED, r.rep, r.t0_ns) for r in runs if r.label == "A"]
    else:
        ev = [_mark(run_id, r.label, r.rep, r.t0_ns) for r in runs]
    return ev + [end_mark(runs, run_id)]


def comparison(runs: list[HttpRun], load: str, pcts, goodput):
    """(each run's ``probes.ab.WindowResult``, the ``probes.ab.Comparison`` or None, why not):
    ``probes.ab.analyse`` of the runs' marks and records — the records the trace receives, so
    ``gpuchef report`` of the trace and the attached dashboard's A/B screen give the same
    table. Whole loads: ``MIN_REPETITIONS`` pairs for the verdict."""
    from ..probes import ab as abdef

    reqs = [q for r in runs for q in r.records]
    _, _, _, results, cmp = abdef.analyse(marks(runs, load), reqs, [], run=1, percentiles=pcts,
                                          goodput=goodput or None,
                                          min_pairs=abdef.MIN_REPETITIONS, whole_loads=True)
    why = ""
    if cmp is None:
        bad = [k for k in abdef.LABELS if not any(r.label == k and r.counted for r in results)]
        why = (f"no comparison: setting {' and '.join(bad)} has no counted run "
               f"({'; '.join(r.name + ': ' + r.why for r in results if not r.counted) or 'none'})")
    else:
        cmp.rows = [x for x in cmp.rows if x.key not in STEP_ROWS]
    return results, cmp, why


def trace_meta(arms: dict[str, Arm], loads: dict[str, Any], load: str, reps: int,
               pcts) -> dict[str, Any]:
    """The trace's meta: ``source`` as `top --attach` writes it (``kind`` attached, the URLs),
    ``ab`` as hosted `ab` writes it (settings, ``interleave`` false, repetitions) plus the
    ``load`` and each side's ``url``; ``server_models``: what each server's /v1/models said."""
    from ..sessions.headless import phases_meta
    from ..client.http_load import server_models_meta

    urls = list(dict.fromkeys(a.url for a in arms.values()))
    pa = loads["A"]
    infos = {arms[k].url: loads[k].info for k in arms if loads[k].info is not None}
    return {
        "command": "ab",
        "model": {"name": pa.cfg.model, "random_weights": None, "source": arms["A"].url},
        "device": "remote",
        "source": {"kind": "attached", "urls": urls},
        "server_models": server_models_meta(infos),
        "percentiles": list(pcts),
        "load": {"desc": pa.desc, "endpoint": pa.cfg.endpoint, "model": pa.cfg.model,
                 "num_requests": len(pa.specs)},
        **({"phases": ph} if (ph := phases_meta(pa.wcfg)) is not None else {}),
        "ab": {"run": 1, "interleave": False, "repetitions": reps, "load": load,
               "settings": {k: {"spec": a.spec, "describe": f"{a.url}: {a.describe()}"
                                if len(urls) > 1 else a.describe(), "url": a.url,
                                "changes": a.setting.changes if a.setting else {},
                                "scheduler": a.setting.config.as_dict() if a.setting else None}
                            for k, a in arms.items()}},
    }


def prepare_loads(o: dict[str, Any], arms: dict[str, Arm], model: str) -> dict[str, Any]:
    """Each side's ``PreparedLoad`` (``bench_http.prepare_http_load``) on the same requests: A's
    arrivals, lengths and token ids, drawn below both servers' vocabularies and within both
    context lengths; each side its own model name. Raises ConfigError naming the side's flag."""
    from ..client.bench_http import check_load_flags, http_config, prepare_http_load

    # the load flags are both sides': checked once, in their own words (no side named)
    tok = check_load_flags(o, http_config(o, arms["A"].url))

    def prep(oo: dict[str, Any], k: str) -> Any:
        try:
            return prepare_http_load(oo, base_url=arms[k].url, model=model, tok=tok)
        except ConfigError as e:
            msg, head = str(e), "--base-url "
            if o.get("base_url"):
                raise
            if msg.startswith(head):  # bench's words name its flag: here it is the side's url=
                msg = f"--{k.lower()} url={msg[len(head):]}"
            else:
                msg = f"--{k.lower()} url={arms[k].url}: {msg}"
            raise ConfigError(msg) from None

    loads = {"A": prep(o, "A")}
    loads["B"] = loads["A"] if arms["B"].url == arms["A"].url else prep(o, "B")
    wa, wb = loads["A"].wcfg, loads["B"].wcfg
    if (wa.vocab_size, wa.max_model_len) != (wb.vocab_size, wb.max_model_len):
        lens = [x for x in (wa.max_model_len, wb.max_model_len) if x]
        o2 = {**o, "vocab_size": min(wa.vocab_size, wb.vocab_size),
              "max_model_len": min(lens) if lens else None}
        loads = {k: prep(o2, k) for k in arms}
    if loads["B"] is not loads["A"]:
        loads["B"].specs = loads["A"].specs
    from ..commands.options import print_warning, probe_warning

    if (w := probe_warning(o, loads["A"].specs)):  # once: both sides send these requests
        print_warning(w)
    return loads


class AttachAB:
    """``ABControl`` of two attached servers: the first two ``--attach`` URLs as A and B, sent
    the same load on the same arrivals — ``gpuchef ab --a url=U1 --b url=U2``'s runs
    (``experiments.http.run_ab``: ``ab_load`` "mirrored", every request to both at once, or
    "sequential", the whole load to one then the other), ``repetitions`` of it, on a thread of
    its own. The marks and the client's requests go to the session's timeline and trace as they
    happen, so the A/B screen's windows, pooled figures and verdict are ``probes.ab.analyse`` of
    them (as the command's and the report's). ``loads``: each side's
    ``client.bench_http.PreparedLoad`` (:func:`prepare_loads`). ``busy()``: "" or why an A/B
    cannot start now (gpuchef's own load still being sent)."""

    def __init__(self, urls: Sequence[str], loads: dict[str, Any], ab_load: str,
                 repetitions: int, on_event: Callable[[Any], None],
                 on_record: Callable[[Any], None], busy: Callable[[], str] = lambda: "") -> None:
        self.arms = {k: Arm(k, u, "") for k, u in zip(("A", "B"), urls)}
        self.loads = loads
        self.ab_load = ab_load
        self.repetitions = int(repetitions)
        self._on_event, self._on_record, self._busy = on_event, on_record, busy
        self._state = ABState(load=ab_load, servers={k: a.url for k, a in self.arms.items()},
                              rounds=self.repetitions)
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        #: the runs of the last A/B (:class:`HttpRun`: each side's ClientResults)
        self.runs: list[Any] = []

    def state(self) -> ABState:
        return self._state

    def _set(self, **kw: Any) -> None:
        from dataclasses import replace

        self._state = replace(self._state, **kw)

    def start(self, a: dict[str, Any], b: dict[str, Any], window_s: float,
              rounds: int | None = None) -> ABState:
        """Start a run; ConfigError (nothing sent) when one is going, when ``a``/``b`` name
        knobs (the servers are compared as they are) or when gpuchef's load is being sent."""
        if self._state.active:
            raise ConfigError("an A/B run is going: x stops it")
        if a or b:
            raise ConfigError(f"an A/B of two attached servers compares them as they are: "
                              f"{describe_ab(a, b)} cannot be set here (to set knobs per server "
                              "use gpuchef ab --a url=URL1,KNOB=VALUE --b url=URL2,...)")
        why = self._busy()
        if why:
            raise ConfigError(why)
        reps = int(rounds) if rounds else self.repetitions
        self._cancel = threading.Event()
        self.runs = []
        self._set(active=True, run=self._state.run + 1, rounds=reps, current="", index=0,
                  window_t0_ns=0, status="",
                  settings={k: {} for k in self.arms})
        self._thread = threading.Thread(target=self._run, args=(self._state.run, reps),
                                        name="gpuchef-attach-ab", daemon=True)
        self._thread.start()
        return self._state

    def _run(self, run_id: int, reps: int) -> None:
        from ..client.http_load import error_lines
        from ..probes.ab import parse_mark

        def on_event(ev: Any) -> None:
            m = parse_mark(ev.name)
            if m is not None and m.n is not None:
                self._set(current=m.label, index=m.n, window_t0_ns=ev.t_ns)
            self._on_event(ev)

        def on_result(label: str, rep: int, rec: Any) -> None:
            self._on_record(rec)

        status = ""
        try:
            runs = run_ab(self.ab_load, self.arms, self.loads, reps, run_id=run_id,
                          on_event=on_event, on_result=on_result, cancel=self._cancel)
        except Exception as e:  # never a traceback in the dashboard: one line
            runs, status = [], f"the A/B stopped: {type(e).__name__}: {e}"
        self.runs = runs
        self._on_event(end_mark(runs, run_id, time.monotonic_ns()))
        if self._cancel.is_set():
            status = status or f"stopped after {len(runs)} of {2 * reps} runs"
        for k, arm in self.arms.items():
            res = [x for r in runs if r.label == k for x in r.run.results]
            if res and not any(x.success for x in res):
                status = f"no request to {arm.url} ({k}) succeeded: " + "; ".join(error_lines(res))
                break
            bad = error_lines([x for x in res if not x.success]) if res else []
            if bad and not status:
                status = f"{k} ({arm.url}): " + "; ".join(bad)
        self._set(active=False, current="", status=status)

    def stop(self) -> None:
        """Cancel the run (the requests in flight are dropped; those finished are kept) and
        wait for its thread."""
        self._cancel.set()
        t = self._thread
        if t is not None:
            t.join(10.0)


def describe_ab(a: dict[str, Any], b: dict[str, Any]) -> str:
    return " vs ".join(", ".join(f"{k}={v}" for k, v in d.items()) or "as is" for d in (a, b))
