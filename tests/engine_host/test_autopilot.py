"""The autopilot (engine_host/autopilot.py) against a synthetic step time: a known function of
each scheduled step stands in for the runner, so the fit, the rule and the guards are checked
against numbers worked out independently; then the real engine (tiny model, CPU) with it on
gives the same tokens; then the long-prompt lane against a hand-worked schedule; then bad
targets."""

from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
import pytest
import torch

from gpuchef.engine_host import autopilot as ap_mod
from gpuchef.engine_host.autopilot import MIN_PREFILL_ALLOWANCE, Autopilot, StepTimeModel
from gpuchef.engine_host.vocab.config import (CacheConfig, EngineConfig, SchedulerConfig,
                                              parse_auto_budget)
from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.kv_cache import KVCacheManager
from gpuchef.engine_host.request import Request, RequestStatus, SamplingParams
from gpuchef.engine_host.scheduler import Scheduler

BS = 16


class TrueTime:
    """The synthetic runner's step time (ms): a + m·mixed + b·D + c·P + d·Cd + e·Cp, computed
    from the scheduled step itself (not from the autopilot's features)."""

    def __init__(self, a=8.0, m=2.0, b=0.06, c=0.012, d=3e-5, e=1e-6):
        self.k = dict(a=a, m=m, b=b, c=c, d=d, e=e)

    def scaled(self, f):
        return TrueTime(**{n: v * f for n, v in self.k.items()})

    def __call__(self, out) -> float:
        k = self.k
        D = len(out.decodes)
        cd = sum(r.num_computed_tokens + 1 for r in out.decodes)
        P = sum(n for _, n in out.prefills)
        cp = sum(n * (r.num_computed_tokens + (n + 1) / 2) for r, n in out.prefills)
        return (k["a"] + k["m"] * (P > 0) + k["b"] * D + k["c"] * P + k["d"] * cd
                + k["e"] * cp)


class FakeClock:
    def __init__(self):
        self.ns = 0

    def __call__(self):
        return self.ns


def make_req(i, prompt, out, arrival_ns=0):
    return Request(f"r{i}", list(range(10, 10 + prompt)),
                   SamplingParams(max_tokens=out, ignore_eos=True), arrival_ns=arrival_ns)


def simulate(cfg, steps, true_time, *, seed=0, noise=0.03, every=3, prompt=(600, 1500),
             output=(40, 90), change_at=None, changed=None, num_blocks=8192, clock=None,
             autopilot=None, arrivals_until=None, gap=None, arrivals=None, hook=None):
    """Run the scheduler for ``steps`` steps under a Poisson-ish stream of requests (one every
    ``every`` steps, until step ``arrivals_until``), each step taking ``true_time(out)`` ms
    (times (1 + N(0, noise))) on a simulated clock, plus ``gap(rng)`` ms of the engine's own
    work before the next step (none by default), which the decodes' ITL counts and the step's
    wall time does not. ``arrivals(step)``, when given, is how many requests arrive before
    that step instead; ``hook(step, sched)`` runs before each step (a knob change mid-run).
    Returns per-step dicts and the scheduler."""
    rng = random.Random(seed)
    kv = KVCacheManager(1, num_blocks, BS, 1, 1, torch.float32, torch.device("cpu"))
    sched = Scheduler(cfg, kv)
    clock = clock or FakeClock()
    if autopilot is not None:
        sched.autopilot = autopilot
        autopilot.clock = clock
    rows = []
    n = 0
    for step in range(steps):
        if change_at is not None and step == change_at:
            true_time = changed
        if arrivals is not None:
            k = arrivals(step)
        else:
            k = int(step % every == 0 and (arrivals_until is None or step < arrivals_until))
        for _ in range(k):
            sched.add(make_req(n, rng.randint(*prompt), rng.randint(*output), clock.ns))
            n += 1
        if hook is not None:
            hook(step, sched)
        if sched.autopilot is not None:
            sched.autopilot.clock = clock
        waiting = len(sched.waiting)
        out = sched.schedule()
        if out.is_empty:
            clock.ns += 1_000_000
            continue
        t_true = true_time(out)
        t_meas = t_true * (1.0 + rng.gauss(0.0, noise))
        t_gap = gap(rng) if gap is not None else 0.0
        itl = t_meas + t_gap if out.decodes else -1.0
        ap = sched.autopilot
        d = out.autopilot
        rows.append(dict(step=step, true=t_true, meas=t_meas, itl=itl,
                         pred=d.predicted_ms if d else -1.0,
                         allowance=d.allowance if d else -1, P=out.num_prefill_tokens,
                         D=len(out.decodes), waiting=waiting,
                         active=ap is not None and ap.active,
                         fitted=ap is not None and ap.model.fitted,
                         fit_error=d.fit_error if d else -1.0, state=d.state if d else "",
                         goal=d.goal_ms if d else -1.0))
        for r in out.decodes:
            r.num_computed_tokens += 1
        for r, k in out.prefills:
            r.num_computed_tokens += k
        clock.ns += int((t_meas + t_gap) * 1e6)
        rows[-1]["t_ns"] = clock.ns
        sched.observe(out, t_meas, itl)
        for r in out.decodes + [r for r, _ in out.prefills]:
            if r.num_computed_tokens == r.num_tokens:
                r.output_token_ids.append(7)
                if len(r.output_token_ids) >= r.sampling.max_tokens:
                    sched.remove(r)
    return rows, sched


# -- the fit -----------------------------------------------------------------------------------

def test_fit_recovers_known_coefficients():
    rng = np.random.default_rng(3)
    true = dict(zip(ap_mod.FEATURES, (8.0, 2.0, 0.06, 0.012, 3e-5, 1e-6)))
    m = StepTimeModel()
    for _ in range(400):
        D = int(rng.integers(0, 200))
        P = int(rng.integers(0, 2048)) if rng.random() < 0.7 else 0
        cd = D * int(rng.integers(100, 4000))
        o = int(rng.integers(0, 6000))
        cp = P * (o + (P + 1) / 2)
        y = (true["1"] + true["mixed"] * (P > 0) + true["decode_rows"] * D
             + true["prefill_tokens"] * P + true["decode_context"] * cd
             + true["prefill_context"] * cp) * (1 + rng.normal(0, 0.005))
        m.update(StepTimeModel.features(D, P, cd, cp), y)
    got = m.coefficients()
    for k, v in true.items():
        assert got[k] == pytest.approx(v, rel=0.08), (k, got[k], v)
    assert m.fitted and m.error < 0.02


def test_unexcited_direction_keeps_its_value_instead_of_winding_up():
    # decode-only steps for 2000 steps after a fit: the prefill coefficient has no data, and
    # must neither blow up nor decay to 0 (plain RLS with forgetting winds up here)
    m = StepTimeModel()
    rng = np.random.default_rng(0)
    for i in range(200):
        P = int(rng.integers(1, 2048))
        D = int(rng.integers(1, 100))
        m.update(StepTimeModel.features(D, P, 500 * D, P * P / 2), 8 + 2 + 0.06 * D + 0.012 * P
                 + 3e-5 * 500 * D + 1e-6 * P * P / 2)
    c = m.coefficients()["prefill_tokens"]
    for i in range(2000):
        m.update(StepTimeModel.features(50, 0, 25000, 0), 8 + 0.06 * 50 + 3e-5 * 25000)
    assert np.all(np.isfinite(m.theta))
    assert m.coefficients()["prefill_tokens"] == pytest.approx(c, rel=0.05)


def test_fit_equals_the_recursion_solved_with_numpys_public_solver():
    """The in-place update (numpy's solve gufunc, θ kept as floats for predict) is the
    documented recursion R ← λR + xxᵀ + (1−λ)δI, r ← λr + xy + (1−λ)δθ, θ = R⁻¹r, recomputed
    here with np.linalg.solve; the predictions are θ·x."""
    from gpuchef.engine_host.autopilot import FORGETTING, REGULARISATION

    m = StepTimeModel()
    rng = np.random.default_rng(3)
    lam, reg = FORGETTING, (1 - FORGETTING) * REGULARISATION
    R, r, th = np.eye(6) * REGULARISATION, np.zeros(6), np.zeros(6)
    for i in range(300):
        P, D = int(rng.integers(0, 2048)), int(rng.integers(1, 200))
        x = StepTimeModel.features(D, P, 800 * D, P * P / 2)
        y = (8 + 2 * bool(P) + 0.06 * D + 0.012 * P + 2e-5 * 800 * D) * (1 + 0.005 * rng.standard_normal())
        xv = np.array(x)
        assert m.predict(x) == pytest.approx(float(th @ xv), rel=1e-9, abs=1e-12)
        m.update(x, y)
        R = lam * R + np.outer(xv, xv) + reg * np.eye(6)
        r = lam * r + xv * y + reg * th
        th = np.linalg.solve(R, r)
        assert m.theta == pytest.approx(th, rel=1e-9, abs=1e-12)


# -- the rule --------------------------------------------------------------------------------

ITL = 30.0


def test_allowance_keeps_predicted_and_measured_step_time_under_the_itl_target():
    cfg = SchedulerConfig(max_num_batched_tokens=2048, auto_budget=f"itl_p99:{ITL}ms")
    true = TrueTime()
    load = dict(every=2, prompt=(800, 2000))
    rows, sched = simulate(cfg, 900, true, **load)
    act = [r for r in rows if r["active"] and r["waiting"] > 0]
    assert len(act) > 350, "the controller never took over"
    # on the steps it steered with work waiting: the prediction and the true time are under
    # the target (unless the decodes alone leave less than the minimum allowance)
    steered = [r for r in act if r["allowance"] > MIN_PREFILL_ALLOWANCE]
    assert len(steered) > 350
    assert max(r["pred"] for r in steered) <= ITL
    assert np.percentile([r["true"] for r in steered], 99) <= ITL
    assert np.percentile([r["meas"] for r in steered], 99) <= ITL * 1.03
    # and it uses the room: the mean step is over 80 % of the target, not a timid floor
    assert np.mean([r["true"] for r in steered]) > 0.8 * ITL
    # the static budget (the reference) breaks the same target on the same load
    static, _ = simulate(SchedulerConfig(max_num_batched_tokens=2048), 900, true, **load)
    assert np.percentile([r["true"] for r in static if r["P"] > 0], 99) > ITL * 1.2


def test_guards_allowance_within_budget_left_and_never_below_the_minimum():
    cfg = SchedulerConfig(max_num_batched_tokens=512, auto_budget="itl_p99:12ms")
    rows, _ = simulate(cfg, 600, TrueTime())
    for r in rows:
        if r["allowance"] >= 0:
            left = 512 - r["D"]
            assert r["allowance"] <= left
            assert r["allowance"] >= min(MIN_PREFILL_ALLOWANCE, left)
            assert r["P"] <= r["allowance"]
    # a 12 ms target leaves less than the minimum allowance once the decodes, a prefill step's
    # own cost and the headroom are taken (the decodes alone are within it): the floor keeps
    # prefill going
    assert any(r["active"] and r["allowance"] == MIN_PREFILL_ALLOWANCE and r["P"] > 0
               for r in rows)


RECONVERGE_STEPS = 60  # stated in docs/autopilot.md


@pytest.mark.parametrize("factor", [1.5, 0.6], ids=["heavier", "lighter"])
def test_reconverges_after_a_step_change_in_load(factor):
    cfg = SchedulerConfig(max_num_batched_tokens=2048, auto_budget=f"itl_p99:{ITL}ms")
    change = 500
    rows, _ = simulate(cfg, 900, TrueTime(), change_at=change, changed=TrueTime().scaled(factor),
                       noise=0.02)
    assert rows[change - 30]["active"]
    after = [r for r in rows if r["step"] >= change]
    # steps until the prediction is within 10 % of the new truth for 10 steps in a row
    run = 0
    for i, r in enumerate(after):
        run = run + 1 if r["pred"] > 0 and abs(r["pred"] - r["true"]) / r["true"] < 0.10 else 0
        if run == 10:
            settled = i - 9
            break
    else:
        pytest.fail("the model never re-converged")
    assert settled <= RECONVERGE_STEPS
    # once settled, the true step time is under the target on steered steps
    late = [r for r in after[settled + 10:] if r["active"] and r["allowance"] > MIN_PREFILL_ALLOWANCE]
    assert late and np.percentile([r["true"] for r in late], 99) <= ITL


def test_ttft_at_risk_raises_the_allowance():
    # a fitted model, 40 decodes running, 40 000 tokens queued 1.5 s ago against a 2 s TTFT
    # target: the ITL rule alone allows P_itl; the TTFT rule must allow more
    model = StepTimeModel()
    rng = np.random.default_rng(1)
    for _ in range(300):
        D, P = int(rng.integers(1, 100)), int(rng.integers(1, 2048)) * (rng.random() < 0.7)
        cd = D * int(rng.integers(100, 2000))
        model.update(StepTimeModel.features(D, P, cd, P * (P + 1) / 2),
                     8 + 2 * (P > 0) + 0.06 * D + 0.012 * P + 3e-5 * cd + 1e-6 * P * (P + 1) / 2)
    kv = KVCacheManager(1, 8192, BS, 1, 1, torch.float32, torch.device("cpu"))

    def allowance(spec):
        sched = Scheduler(SchedulerConfig(max_num_batched_tokens=4096, auto_budget=spec), kv)
        clock = FakeClock()
        clock.ns = 1_500_000_000
        a = Autopilot(parse_auto_budget(spec), model=model)
        a.clock = clock
        sched.autopilot = a
        for i in range(40):  # decodes, admitted long ago
            r = make_req(i, 500, 100)
            r.prefill_target = r.num_computed_tokens = 500
            r.status = RequestStatus.RUNNING
            sched.running.append(r)
        for i in range(20):  # 20 × 2000 tokens waiting since t = 0
            sched.waiting.append(make_req(100 + i, 2000, 10, arrival_ns=0))
        out = sched.schedule()
        return out.autopilot.allowance, len(out.decodes)

    model.error = 0.10  # a 10 % model error: the ITL goal keeps headroom under the target
    p_itl, d = allowance(f"itl_p99:{ITL}ms")
    p_both, _ = allowance(f"itl_p99:{ITL}ms,ttft_p99:2s")

    # independent check from the true coefficients (the fit is exact): the largest P whose
    # step time is within `goal`
    def p_at(goal):
        fixed = 8 + 2 + 0.06 * d + 3e-5 * 501 * d
        return (-0.012 + np.sqrt(0.012 ** 2 + 4 * 0.5e-6 * (goal - fixed))) / (2 * 0.5e-6)

    assert d == 40
    assert p_itl == pytest.approx(p_at(ITL / (1 + 2.3263 * 1.25 * 0.10)), rel=0.03)
    # at risk, the TTFT rule raises it to serve the requests in line that can still be served
    # (by hand: the j-th of them, T = 2000·j tokens ahead, needs P ≥ T·f/(g − 1500 ms − c·T),
    # g = 2 s/(1 + 2.33·σ)), but only up to the ITL target itself
    f = 8 + 2 + 0.06 * d + 3e-5 * 501 * d
    g = 2000 / (1 + 2.3263 * 1.25 * 0.10)
    needs = [T * f / (g - 1500 - 0.012 * T) for T in (2000 * j for j in range(1, 21))
             if g - 1500 - 0.012 * T > 0]
    need = max(n for n in needs if n <= 4096 - d)
    assert p_itl < need
    assert p_both == pytest.approx(min(need, p_at(ITL)), rel=0.03)
    assert p_both > 1.2 * p_itl


def test_falls_back_to_the_measured_itl_with_a_status():
    events = []
    spec = parse_auto_budget(f"itl_p99:{ITL}ms")
    a = Autopilot(spec, notify=lambda k, m: events.append((k, m)))
    assert events[0][0] == "warning" and "fitting" in events[0][1]
    cfg = SchedulerConfig(max_num_batched_tokens=2048, auto_budget=spec.canonical)
    rows, sched = simulate(cfg, 300, TrueTime(), autopilot=a)
    # not fitted yet: it learns with 1/8, 1/4, 1/2 of the budget left in turn
    learning = [r for r in rows if not r["active"]]
    assert learning and rows[0] is learning[0]
    for r in learning:
        left = 2048 - r["D"]
        assert r["allowance"] in (left >> 3, left >> 2, left >> 1), r
    assert {r["allowance"] * 8 // (2048 - r["D"]) for r in learning} >= {1, 2, 4}
    assert any(k == "notice" for k, _ in events), events
    assert rows[-1]["active"]

    # then the step time stops following any model (×0.2/×1/×3 at random): fallback, from a
    # quarter of the budget left, the share cut as tokens miss the target
    class Wild:
        def __init__(self):
            self.rng = random.Random(5)

        def __call__(self, out):
            return TrueTime()(out) * self.rng.choice((0.2, 1.0, 3.0))

    n_events = len(events)
    rows2, _ = simulate(cfg, 200, Wild(), autopilot=a, seed=9)
    assert any(k == "warning" and "error" in m for k, m in events[n_events:]), events
    fell = [r for r in rows2 if not r["active"] and r["fitted"]]
    start = ap_mod.FALLBACK_SHARE_START
    assert fell and fell[0]["allowance"] == int((2048 - fell[0]["D"]) * start)
    assert all(r["allowance"] <= 2048 - r["D"] for r in fell)
    assert all(r["state"] == ap_mod.FALLBACK for r in fell)
    assert min(r["allowance"] / (2048 - r["D"]) for r in fell) < start


def test_autopilot_cost_per_step_is_small():
    # not the benchmark (benchmarks/bench_autopilot.py): a loose guard that the per-step work
    # stays in the tens of microseconds, not milliseconds
    import time

    cfg = SchedulerConfig(max_num_batched_tokens=2048, auto_budget=f"itl_p99:{ITL}ms,ttft_p99:2s")
    rows, sched = simulate(cfg, 200, TrueTime())
    a = sched.autopilot
    out = sched.schedule()
    t = time.perf_counter()
    for _ in range(200):
        d = a.finish(out, a.choose(sched, out, 2048 - len(out.decodes)))
        a.observe(d, 20.0, 21.0, len(out.decodes))
    per = (time.perf_counter() - t) / 200
    assert per < 2e-3


# -- the engine: same tokens with the controller on ------------------------------------------

@pytest.mark.parametrize("async_on", [False, True], ids=["sync", "async"])
def test_engine_same_tokens_with_the_autopilot_on(async_on):
    from gpuchef.engine_host.engine import LLMEngine

    N = 24

    def run(auto):
        cfg = EngineConfig(model="tiny", device="cpu", max_model_len=512,
                           cache=CacheConfig(num_gpu_blocks=256), async_scheduling=async_on,
                           scheduler=SchedulerConfig(mode="chunked", max_num_batched_tokens=256,
                                                     max_num_seqs=4, auto_budget=auto))
        eng = LLMEngine(cfg)
        true = TrueTime(a=1.0, m=0.5, b=0.05, c=0.02, d=1e-4, e=1e-6)
        sched = eng.scheduler
        orig = sched.observe
        # the fit hears a known step time (CPU timing on a shared machine is not one); the
        # tokens are the model's, computed for real
        sched.observe = lambda out, ms, itl: orig(out, true(out))
        rng = random.Random(4)
        for i in range(N):  # at most 4 running: prompts keep arriving at the scheduler
            p = rng.randint(60, 300)
            eng.add_request(f"q{i}", [rng.randrange(1, 500) for _ in range(p)],
                            SamplingParams(max_tokens=rng.randint(10, 30), ignore_eos=True))
        toks, recs = {}, []
        while eng.has_unfinished():
            res = eng.step()
            if res.record is not None:
                recs.append(res.record)
            for f in res.finished:
                toks[f.request_id] = f.output_token_ids
        return toks, recs

    off, recs_off = run("")
    on, recs_on = run("itl_p99:4ms")
    assert on == off and len(on) == N
    assert all(r.prefill_allowance == -1 and r.predicted_ms == -1.0 for r in recs_off)
    # the controller took over and changed when tokens were computed
    steered = [r for r in recs_on if 0 <= r.prefill_allowance < 256 - r.num_decode_reqs]
    assert steered and all(r.num_prefill_tokens <= r.prefill_allowance for r in recs_on
                           if r.prefill_allowance >= 0)
    assert all(r.auto_budget == "itl_p99:4ms" for r in recs_on)
    assert [r.num_prefill_tokens for r in recs_on] != [r.num_prefill_tokens for r in recs_off]
    assert any(r.predicted_ms > 0 for r in recs_on)


# -- the long-prompt lane (vLLM V0's max_long_partial_prefills) ------------------------------

def lane_schedule(max_long, threshold=100, partial=2):
    """Budget 256, chunk/threshold 100, 2 partial prefills; L1, L2 (500 tokens) then S1-S3 (100)
    all queued at step 0, one output token each. Returns per step [(name, chunk)] and each
    request's first-token step."""
    cfg = SchedulerConfig(max_num_batched_tokens=256, long_prefill_token_threshold=threshold,
                          max_num_partial_prefills=partial, max_long_partial_prefills=max_long)
    kv = KVCacheManager(1, 1024, 4, 1, 1, torch.float32, torch.device("cpu"))
    sched = Scheduler(cfg, kv)
    reqs = [Request(name, [5] * n, SamplingParams(max_tokens=1, ignore_eos=True), arrival_ns=i)
            for i, (name, n) in enumerate([("L1", 500), ("L2", 500), ("S1", 100), ("S2", 100),
                                           ("S3", 100)])]
    for r in reqs:
        sched.add(r)
    steps, first = [], {}
    for step in range(40):
        out = sched.schedule()
        if out.is_empty:
            break
        steps.append([(r.request_id, n) for r, n in out.prefills])
        for r, n in out.prefills:
            r.num_computed_tokens += n
            if r.num_computed_tokens == r.num_tokens:
                first[r.request_id] = step
                r.output_token_ids.append(7)
                sched.remove(r)
    assert len(first) == 5
    return steps, first


def test_long_prompt_lane_lets_short_prompts_pass_hand_worked():
    # worked by hand from vLLM V0's PartialPrefillMetadata.can_schedule (vllm/core/
    # scheduler.py): a waiting prompt over long_prefill_token_threshold is passed over while
    # max_long_partial_prefills long prompts are in prefill; shorter ones behind it go ahead
    steps, first = lane_schedule(max_long=1)
    assert steps[0] == [("L1", 100), ("S1", 100), ("S2", 56)]
    assert steps[1] == [("L1", 100), ("S2", 44), ("S3", 100)]
    assert steps[2] == steps[3] == [("L1", 100)]
    assert steps[4] == [("L1", 100), ("L2", 100)]  # L1's last 100 are no longer long
    assert first == {"S1": 0, "S2": 1, "S3": 1, "L1": 4, "L2": 8}
    # without the lane (both long prompts may be partial) the short ones wait for them
    steps, first = lane_schedule(max_long=2)
    assert steps[0] == steps[1] == [("L1", 100), ("L2", 100)]
    assert steps[4] == [("L1", 100), ("L2", 100), ("S1", 56)]
    assert first == {"L1": 4, "L2": 4, "S1": 5, "S2": 5, "S3": 5}


def test_long_prompt_lane_is_off_with_one_partial_prefill_or_no_threshold():
    # vLLM V0 applies it only with max_num_partial_prefills > 1; gpuchef's threshold 0 means
    # "no cap", so no prompt is long: the schedule is the same whatever max_long says
    for kw in (dict(threshold=100, partial=1), dict(threshold=0, partial=2)):
        assert lane_schedule(1, **kw) == lane_schedule(2, **kw)
    assert lane_schedule(1) != lane_schedule(2)


# -- bad targets -----------------------------------------------------------------------------

@pytest.mark.parametrize("spec, says", [
    ("itl_p99:0", "out of range"),
    ("itl_p99:0ms", "out of range"),
    ("itl_p99:-5ms", "negative"),
    ("itl_p99:fast", "not a duration"),
    ("itl_p99=50ms", "not METRIC_STAT:DURATION"),
    ("tpot_p99:50ms", "not METRIC_STAT:DURATION"),
    ("itl_p101:50ms", "percentile 101 is out of range"),
    ("ttft_p99:2s", "has no ITL target"),
    ("itl_p99:50ms,ttft_p99:20ms", "below one step"),
    ("itl_p99:50ms,itl_p50:20ms", "given twice"),
    ("itl_p99:9999s", "out of range"),
    ("itl_p99:-1ms", "'-1ms' is negative"),
    ("itl_p99:0.001ms", "'0.001ms' is out of range: allowed \\[1 ms, 600 s\\]"),
    ("0", "is not METRIC_STAT:DURATION.*or off"),
    ("none", "is not METRIC_STAT:DURATION.*or off"),
    ("false", "is not METRIC_STAT:DURATION.*or off"),
])
def test_bad_targets_are_refused_naming_the_value(spec, says):
    with pytest.raises(ConfigError, match=says) as e:
        parse_auto_budget(spec)
    assert spec.split(",")[0].split(":")[0] in str(e.value)
    with pytest.raises(ConfigError, match=says):
        SchedulerConfig(auto_budget=spec)


def test_good_targets_parse_to_one_canonical_form():
    assert parse_auto_budget("itl_p99:50ms,ttft_p99:2s").canonical == "itl_p99:50ms,ttft_p99:2000ms"
    assert parse_auto_budget("ITL_P99:0.05s").itl_ms == pytest.approx(50.0)
    assert parse_auto_budget("itl_median:40").itl_stat == "median"
    assert parse_auto_budget("itl_p99:1ms").itl_ms == 1.0  # the lower bound itself is allowed
    for off in (None, "", "off", "OFF"):
        assert parse_auto_budget(off) is None
        assert SchedulerConfig(auto_budget=off or "").auto_budget == ""


def test_host_turns_it_on_live_records_a_knob_event_and_refuses_bad_targets():
    import time

    from gpuchef.engine_host.engine import LLMEngine
    from gpuchef.engine_host.host import EngineHost
    from gpuchef.engine_host.sinks import ListenerSink

    cfg = EngineConfig(model="tiny", device="cpu", max_model_len=512,
                       cache=CacheConfig(num_gpu_blocks=256),
                       scheduler=SchedulerConfig(mode="chunked", max_num_batched_tokens=128))
    steps, events = [], []
    host = EngineHost(LLMEngine(cfg),
                      sinks=[ListenerSink(on_step=steps.append, on_event=events.append)])
    host.start()
    try:
        for i in range(6):
            host.submit(f"r{i}", list(range(10, 110)), SamplingParams(max_tokens=40, ignore_eos=True))
        with pytest.raises(ConfigError, match="below one step"):
            host.set_auto_budget("itl_p99:50ms,ttft_p99:1ms")
        assert host.set_auto_budget("itl_p99:50ms,ttft_p99:2s") == "itl_p99:50ms,ttft_p99:2000ms"
        t = time.monotonic() + 30
        while not any(e.kind == "knob" for e in events):
            assert time.monotonic() < t
            time.sleep(0.01)
        host.set_auto_budget(None)
        assert host.wait_done(60)
    finally:
        host.stop()
    knob = [e for e in events if e.kind == "knob" and e.name == "auto_budget"]
    assert [(e.old, e.new) for e in knob] == [("", "itl_p99:50ms,ttft_p99:2000ms"),
                                               ("itl_p99:50ms,ttft_p99:2000ms", "")]
    status = [e for e in events if e.name == "auto_budget" and e.kind in ("warning", "notice")]
    assert status and status[0].kind == "warning" and "fitting" in status[0].message
    assert not [e for e in events if e.kind == "error"]
    on = [s for s in steps if knob[0].step <= s.step < knob[1].step]
    assert on and all(s.auto_budget and s.prefill_allowance >= 0 for s in on)
    assert all(s.prefill_allowance == -1 for s in steps if s.step >= knob[1].step)



# -- the cheaper per-step path chooses as the old one did ------------------------------------

class WildTime:
    """A step time that follows no model: the true one × 0.2, 1 or 3 at random."""

    def __init__(self, seed=5):
        self.rng = random.Random(seed)

    def __call__(self, out):
        return TrueTime()(out) * self.rng.choice((0.2, 1.0, 3.0))


#: Loads whose every step's decision (allowance, prefill tokens, predicted_ms, fit_error) was
#: recorded in test_autopilot_decisions.json by the autopilot as it was before its per-step cost
#: was cut (commit ab5331b: the pass over the running list, nine numpy calls per fit): learning,
#: steering with a TTFT target at risk, a median target, a step change, a fallback. None of
#: them has decodes alone over the ITL target (the infeasible state came after).
RECORDED = {
    "itl_ttft": dict(budget=2048, spec="itl_p99:30ms,ttft_p99:2s", steps=700, time=TrueTime,
                     sim=dict(every=2, prompt=(800, 2000))),
    "itl_median": dict(budget=1024, spec="itl_median:25ms", steps=400, time=TrueTime,
                       sim=dict(seed=3)),
    "step_change": dict(budget=2048, spec="itl_p99:30ms,ttft_p50:3s", steps=700, time=TrueTime,
                        sim=dict(change_at=400, changed=TrueTime().scaled(1.5), noise=0.02)),
    "wild": dict(budget=2048, spec="itl_p99:30ms", steps=400, time=WildTime,
                 sim=dict(seed=9, noise=0.0)),
}


def recorded_decisions(name):
    kw = RECORDED[name]
    cfg = SchedulerConfig(max_num_batched_tokens=kw["budget"], auto_budget=kw["spec"])
    rows, _ = simulate(cfg, kw["steps"], kw["time"](), **kw["sim"])
    return rows


@pytest.mark.parametrize("name", list(RECORDED))
def test_cheaper_path_makes_the_recorded_choices(name, monkeypatch):
    import json

    # the loads were recorded before the ITL feedback existed, when fallback was the static
    # budget: the model's own path is what is compared (the feedback and fallback's share are
    # tested on their own below)
    monkeypatch.setattr(ap_mod, "FEEDBACK_GAIN", 0.0)
    monkeypatch.setattr(ap_mod, "_LOG_SHARE_START", 0.0)
    from pathlib import Path

    want = json.loads((Path(__file__).with_name("test_autopilot_decisions.json")).read_text())[name]
    rows = recorded_decisions(name)
    got = [[r["allowance"], r["P"], r["pred"], r["fit_error"]] for r in rows]
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, (name, i, g, w)  # exact: the same arithmetic in the same order
    states = {r["state"] for r in rows}
    assert ap_mod.INFEASIBLE not in states
    if name == "wild":
        assert ap_mod.FALLBACK in states
    else:
        assert {ap_mod.LEARNING, ap_mod.STEERING} <= states


# -- an infeasible ITL target ------------------------------------------------------------------

def true_fixed_ms(row_D, row_cd, k=TrueTime().k):
    """The true step time of the decodes before any prefill token (a + m + b·D + d·Cd)."""
    return k["a"] + k["m"] + k["b"] * row_D + k["d"] * row_cd


def infeasible_run(**kw):
    """ITL target 12 ms against decodes that alone take longer once ~40 of them run (prompts of
    100-300 tokens, 150-250 output tokens, one a step until step 450, then none); per step the
    true fixed part too. Returns the rows and the status events."""
    events = []
    a = Autopilot(parse_auto_budget("itl_p99:12ms"), notify=lambda k, m: events.append((k, m)))
    cfg = SchedulerConfig(max_num_batched_tokens=2048, auto_budget="itl_p99:12ms")
    true = TrueTime()

    class Recording:  # the true time, and the decodes' true fixed part, of each scheduled step
        def __init__(self):
            self.fixed = []

        def __call__(self, out):
            cd = sum(r.num_computed_tokens + 1 for r in out.decodes)
            self.fixed.append(true_fixed_ms(len(out.decodes), cd))
            return true(out)

    rec = Recording()
    rows, _ = simulate(cfg, 1100, rec, every=1, prompt=(100, 300), output=(150, 250),
                       arrivals_until=450, autopilot=a, **kw)
    for r, f in zip(rows, rec.fixed):
        r["fixed"] = f
    return rows, events


def test_infeasible_itl_target_takes_the_static_budget_and_leaves_when_the_decodes_fall():
    rows, events = infeasible_run()
    inf = [r for r in rows if r["state"] == ap_mod.INFEASIBLE]
    assert len(inf) > 200, "never judged infeasible"
    # in the state: the static budget (all of the budget left after the decodes)
    assert all(r["allowance"] == 2048 - r["D"] for r in inf)
    # judged against the truth: the decodes' own time is over the target whenever it is in the
    # state (the model's error is a few %), and it is in the state whenever that time is well
    # over (past 1.25 × the target) while the model steers
    assert min(r["fixed"] for r in inf) > 12.0 * 0.97
    active = [r for r in rows if r["active"]]
    assert all(r["state"] == ap_mod.INFEASIBLE for r in active if r["fixed"] > 12.0 * 1.25)
    assert all(r["state"] != ap_mod.INFEASIBLE for r in active if r["fixed"] < 12.0 * 0.9)
    # no flapping while the decodes' time hovers near the target: one entry, one exit
    states = [r["state"] for r in rows]
    entries = sum(1 for a, b in zip(states, states[1:]) if b == ap_mod.INFEASIBLE != a)
    assert entries == 1
    said = [(k, m) for k, m in events if "before any prefill" in m]
    assert [k for k, _ in said] == ["warning", "notice"]
    assert "over the ITL target 12 ms" in said[0][1] and "static budget" in said[0][1]
    assert "within the ITL target 12 ms" in said[1][1]
    # the arrivals stop, the decodes finish: it leaves and steers again
    last_inf = max(i for i, s in enumerate(states) if s == ap_mod.INFEASIBLE)
    assert rows[last_inf]["step"] > 450
    assert ap_mod.STEERING in states[last_inf:]


def test_infeasible_state_serves_the_queue_the_minimum_allowance_starves(monkeypatch):
    # the same load with the state disabled: the allowance sits at the 64-token floor and the
    # queue grows; with it, the static budget keeps the queue shorter (by less than the floor
    # alone would: while the decodes fit just under the target, the floor keeps within it)
    rows, _ = infeasible_run()
    monkeypatch.setattr(ap_mod, "INFEASIBLE_ENTER", float("inf"))
    floor, _ = infeasible_run()
    assert ap_mod.INFEASIBLE not in {r["state"] for r in floor}
    assert any(r["active"] and r["allowance"] == MIN_PREFILL_ALLOWANCE and r["waiting"] > 100
               for r in floor)
    assert max(r["waiting"] for r in rows) * 2 < max(r["waiting"] for r in floor)


def test_infeasible_hysteresis_enters_over_the_margin_and_leaves_within_the_target():
    events = []
    a = Autopilot(parse_auto_budget("itl_p99:50ms"), notify=lambda k, m: events.append(k))
    n0 = len(events)
    seq = [(54.0, False), (55.0, False),   # within 1.1 × 50 ms: not entered
           (55.1, True), (52.0, True), (50.5, True),  # entered; kept inside the band
           (50.0, False), (54.9, False),  # left at ≤ 50 ms; not entered again inside the band
           (60.0, True)]
    for ms, want in seq:
        assert a._infeasible(ms) is want, (ms, want)
        assert a.infeasible is want
    assert events[n0:] == ["warning", "notice", "warning"]
    # new targets are judged afresh against the same band: 60 ms is within a 100 ms target
    a.set_spec(parse_auto_budget("itl_p99:100ms"))
    assert a._infeasible(60.0) is False and events[-1] == "notice"


def test_engine_records_the_infeasible_state_and_the_trace_round_trips_it(tmp_path):
    from gpuchef.engine_host.engine import LLMEngine
    from gpuchef.probes.recorder import TraceRecorder, read_trace

    cfg = EngineConfig(model="tiny", device="cpu", max_model_len=512,
                       cache=CacheConfig(num_gpu_blocks=256),
                       scheduler=SchedulerConfig(mode="chunked", max_num_batched_tokens=256,
                                                 max_num_seqs=8, auto_budget="itl_p99:5ms"))
    eng = LLMEngine(cfg)
    # a known step time whose fixed part (6 ms + 0.1 ms per decode) is over the 5 ms target
    true = TrueTime(a=6.0, m=0.5, b=0.1, c=0.01, d=1e-5, e=1e-7)
    sched = eng.scheduler
    orig = sched.observe
    sched.observe = lambda out, ms, itl: orig(out, true(out))
    rng = random.Random(2)
    for i in range(24):
        eng.add_request(f"q{i}", [rng.randrange(1, 500) for _ in range(rng.randint(60, 200))],
                        SamplingParams(max_tokens=rng.randint(20, 40), ignore_eos=True))
    recs = []
    while eng.has_unfinished():
        res = eng.step()
        if res.record is not None:
            recs.append(res.record)
    inf = [r for r in recs if r.autopilot_state == ap_mod.INFEASIBLE]
    assert inf and all(r.prefill_allowance == 256 - r.num_decode_reqs for r in inf)
    path = tmp_path / "t.jsonl"
    with TraceRecorder(path) as tr:
        for r in recs:
            tr.record(r)
    back = read_trace(path).steps
    assert [s.autopilot_state for s in back] == [r.autopilot_state for r in recs]
    assert back == recs


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow


# -- the ITL contract: P99 ITL over any 30 s window ≤ 1.05 × the target where feasible ----------

class LongChunkTime(TrueTime):
    """The property that broke the contract on the GPU (long prompts, a TTFT target at risk):
    a step time whose error grows with the prefill chunk (2 % + 15 % per 4096 tokens) and whose
    cost grows faster than linear past 2048 tokens, which no linear model fits, under an H100
    8B-like cost (ms)."""

    def __init__(self, seed=1):
        super().__init__()
        self.rng = random.Random(seed)

    def __call__(self, out):
        t = super().__call__(out)
        P = sum(n for _, n in out.prefills)
        t *= 1.0 + self.rng.gauss(0.0, 0.02 + 0.15 * P / 4096)
        return t + (0.004 * (P - 2048) ** 2 / 2048 if P > 2048 else 0.0)


def host_gap(rng):
    """The engine's own work between steps (ms): 0.5 ms plus an exponential of mean 2 ms."""
    return 0.5 + rng.expovariate(0.5)


def weighted_p99(itl, rows):
    """P99 of the per-token ITL: each step's ITL counted once per decode row."""
    x = np.asarray(itl, dtype=float)
    w = np.asarray(rows, dtype=float)
    o = np.argsort(x)
    c = np.cumsum(w[o]) / w.sum()
    return float(x[o][np.searchsorted(c, 0.99)])


def window_p99s(rows, key="itl", window_s=30.0, every_s=5.0):
    """The token-weighted P99 of ``key`` over each ``window_s`` window (every ``every_s``) of
    the steps the contract covers: steered, with decode rows (the infeasible state, learning
    and fallback are outside it)."""
    cov = [r for r in rows if r["state"] == ap_mod.STEERING and r["itl"] > 0]
    t = np.array([r["t_ns"] for r in cov]) / 1e9
    out = []
    for w0 in np.arange(t[0], t[-1] - window_s + every_s, every_s):
        sel = [r for r, ti in zip(cov, t) if w0 <= ti < w0 + window_s]
        if len(sel) >= 100:
            out.append(weighted_p99([r[key] for r in sel], [r["D"] for r in sel]))
    return out


def contract_run(every, *, gain=None, monkeypatch=None, steps=3000, seed=3, **kw):
    if gain is not None:
        monkeypatch.setattr(ap_mod, "FEEDBACK_GAIN", gain)
    cfg = SchedulerConfig(max_num_batched_tokens=4096, max_num_seqs=256,
                          auto_budget="itl_p99:50ms,ttft_p50:2s")
    rows, sched = simulate(cfg, steps, LongChunkTime(seed), every=every, prompt=(2000, 8000),
                           output=(20, 200), noise=0.0, gap=host_gap, seed=seed,
                           num_blocks=200_000, **kw)
    return rows, sched


@pytest.mark.parametrize("every", [1, 3], ids=["overload", "near_capacity"])
def test_itl_contract_holds_in_every_30s_window_under_overload(every, monkeypatch):
    # long prompts (2-8K), a TTFT target at risk, a step time no linear model fits and the
    # engine's own gap between steps: the P99 ITL in every 30 s window within 1.05 × 50 ms
    rows, sched = contract_run(every)
    assert sum(r["state"] == ap_mod.STEERING for r in rows) > 0.9 * len(rows)
    assert rows[-1]["waiting"] > 50 or every > 1  # overloaded: the queue keeps growing
    windows = window_p99s(rows)
    assert len(windows) >= 10
    assert max(windows) <= 1.05 * 50.0, windows
    # the feedback found the model's margin short and tightened the goal
    assert sched.autopilot.kappa < 1.0


def test_without_the_feedback_the_ttft_rule_breaks_the_itl_contract(monkeypatch):
    # the rule before the feedback (the TTFT relaxation up to the ITL target itself, the
    # model's margin alone): near capacity its P99 ITL is over the target by more than noise,
    # so the test above can fail (on the GPU: 62.7 ms against 50 at 4×)
    old, _ = contract_run(3, gain=0.0, monkeypatch=monkeypatch)
    monkeypatch.undo()
    new, _ = contract_run(3)
    assert max(window_p99s(old)) > 1.1 * 50.0
    # kept without turning timid: the steered steps' mean ITL uses most of the target
    steered = [r for r in new if r["state"] == ap_mod.STEERING and r["itl"] > 0]
    assert np.average([r["itl"] for r in steered], weights=[r["D"] for r in steered]) > 0.75 * 50


def test_itl_contract_holds_through_a_burst_and_knob_changes_mid_run():
    # light load, a burst of 200 long prompts at once, light again; mid-run the target goes
    # 50 → 35 ms and the budget 4096 → 2048, then back: each step is judged against the
    # target in force when it was scheduled
    def arrivals(step):
        return 200 if step == 600 else int(step % 6 == 0)

    targets = {}

    def hook(step, sched):
        if step == 1000:
            sched.config = dataclasses.replace(sched.config, max_num_batched_tokens=2048,
                                               auto_budget="itl_p99:35ms,ttft_p50:2s")
        if step == 2000:
            sched.config = dataclasses.replace(sched.config, max_num_batched_tokens=4096,
                                               auto_budget="itl_p99:50ms,ttft_p50:2s")
        targets[step] = parse_auto_budget(sched.config.auto_budget).itl_ms

    cfg = SchedulerConfig(max_num_batched_tokens=4096, max_num_seqs=256,
                          auto_budget="itl_p99:50ms,ttft_p50:2s")
    rows, _ = simulate(cfg, 3000, LongChunkTime(7), prompt=(2000, 8000), output=(20, 200),
                       noise=0.0, gap=host_gap, seed=7, num_blocks=200_000, arrivals=arrivals,
                       hook=hook)
    for r in rows:
        r["ratio"] = r["itl"] / targets[r["step"]]
    assert max(r["waiting"] for r in rows) > 100  # the burst queued
    windows = window_p99s(rows, key="ratio")
    assert len(windows) >= 8
    assert max(windows) <= 1.05, windows
    # the smaller budget was in force: no step over it
    assert all(r["P"] + r["D"] <= 2048 for r in rows if 1000 <= r["step"] < 2000)


def test_feedback_moves_kappa_by_the_share_over_the_target():
    a = Autopilot(parse_auto_budget("itl_p99:50ms"))
    a.model.error = 0.1
    d = ap_mod.Decision(100, ap_mod.STEERING, 0, features=StepTimeModel.features(64, 100, 0, 0))
    # one step of 64 rows over the target: ln κ falls by gain × 64 × (1 − aim)
    a.observe(d, 40.0, 60.0, 64)
    aim = ap_mod.ITL_AIM * 0.01
    assert a.log_kappa == pytest.approx(-ap_mod.FEEDBACK_GAIN * 64 * (1 - aim))
    # under the target: it rises by gain × rows × aim
    before = a.log_kappa
    a.observe(d, 40.0, 45.0, 64)
    assert a.log_kappa - before == pytest.approx(ap_mod.FEEDBACK_GAIN * 64 * aim)
    # a stall of any length moves it by at most FEEDBACK_MAX_STEP
    before = a.log_kappa
    a.observe(d, 40.0, 10_000.0, 1000)
    assert before - a.log_kappa == pytest.approx(ap_mod.FEEDBACK_MAX_STEP * (1 - aim))
    # bounded: never below KAPPA_MIN, never a goal above the target itself
    for _ in range(200):
        a.observe(d, 40.0, 60.0, 256)
    assert a.kappa == pytest.approx(ap_mod.KAPPA_MIN)
    for _ in range(200_000):
        a.observe(d, 40.0, 10.0, 256)
    assert a.itl_goal() == pytest.approx(50.0)
    # steps it did not steer, and steps without decode rows, leave it alone
    k = a.log_kappa
    a.observe(ap_mod.Decision(100, ap_mod.INFEASIBLE, 0, features=d.features), 40.0, 500.0, 64)
    a.observe(d, 40.0, -1.0, 0)
    assert a.log_kappa == k
    # new targets start it afresh
    a.set_spec(parse_auto_budget("itl_p50:50ms"))
    assert a.kappa == 1.0


def test_itl_contract_holds_on_the_tiny_engine_under_overload(monkeypatch):
    # the engine itself (tiny model, CPU: real scheduling, tokens, records, the ITL it times
    # from its tokens, the decision round trip) with its clock driven by a step time that has
    # the property above, scaled to its short prompts (a CPU step's own time, on a shared
    # machine, is not one a test can hold to 5 %), plus the engine's gap between steps
    import types

    from gpuchef.engine_host import engine as engine_mod
    from gpuchef.engine_host.engine import LLMEngine

    clock = FakeClock()
    clock.ns = 1_000_000_000
    fake_time = types.SimpleNamespace(monotonic_ns=clock)
    monkeypatch.setattr(engine_mod, "time", fake_time)
    monkeypatch.setattr(ap_mod, "time", fake_time)
    rng = random.Random(11)

    def step_ms(out):  # 8 ms + 2 mixed + 0.06/decode row + 0.2/prefill token, superlinear past
        P = out.num_prefill_tokens  # 128, its error growing with the chunk
        t = 8.0 + 2.0 * (P > 0) + 0.06 * len(out.decodes) + 0.2 * P
        t *= 1.0 + rng.gauss(0.0, 0.02 + 0.10 * P / 256)
        return t + (0.06 * (P - 128) ** 2 / 128 if P > 128 else 0.0)

    cfg = EngineConfig(model="tiny", device="cpu", max_model_len=1024,
                       cache=CacheConfig(num_gpu_blocks=2048),
                       scheduler=SchedulerConfig(mode="chunked", max_num_batched_tokens=512,
                                                 max_num_seqs=64,
                                                 auto_budget="itl_p99:50ms,ttft_p50:2s"))
    eng = LLMEngine(cfg)
    execute = eng.runner.execute

    def timed(out):
        res = execute(out)
        clock.ns += int(step_ms(out) * 1e6)
        return res

    eng.runner.execute = timed
    recs = []
    for i in range(900):
        if True:  # a 100-400 token prompt every step: more than it can prefill
            p = rng.randint(100, 400)
            eng.add_request(f"q{i}", [rng.randrange(1, 500) for _ in range(p)],
                            SamplingParams(max_tokens=rng.randint(10, 40), ignore_eos=True))
        clock.ns += int(host_gap(rng) * 1e6)
        res = eng.step()
        if res.record is not None:
            recs.append(res.record)
    assert recs[-1].num_waiting > 50  # overloaded
    rows = [dict(state=r.autopilot_state, itl=r.itl_ms, D=r.num_decode_reqs, t_ns=r.t_end_ns)
            for r in recs]
    assert sum(r["state"] == ap_mod.STEERING for r in rows) > 0.9 * len(rows)
    windows = window_p99s(rows, every_s=1.0)
    assert len(windows) >= 4
    assert max(windows) <= 1.05 * 50.0, windows
    # the ITL the engine timed is the gap between a decode row's tokens, engine work included
    steered = [r for r in recs if r.autopilot_state == ap_mod.STEERING and r.itl_ms > 0]
    assert all(r.goal_ms <= 50.0 for r in steered)
    assert np.median([r.itl_ms - r.wall_ms for r in steered]) > 0.5


def test_fallback_keeps_the_itl_promise_without_a_model():
    # a step time no model follows (×0.2, ×1 or ×3 at random): the model's error keeps it in
    # fallback, where the measured ITL alone sets the allowance; the promise still holds in
    # every 30 s window, where the static budget (what fallback was) breaks it
    def run(gain, start):
        keep = ap_mod.FEEDBACK_GAIN, ap_mod._LOG_SHARE_START
        ap_mod.FEEDBACK_GAIN, ap_mod._LOG_SHARE_START = gain, math.log(start)
        try:
            cfg = SchedulerConfig(max_num_batched_tokens=2048, auto_budget="itl_p99:60ms")
            return simulate(cfg, 4000, WildTime(seed=3), every=3, noise=0.0, gap=host_gap,
                            seed=4)[0]
        finally:
            ap_mod.FEEDBACK_GAIN, ap_mod._LOG_SHARE_START = keep

    def windows(rows):
        fb = [dict(r, state=ap_mod.STEERING) for r in rows if r["state"] == ap_mod.FALLBACK]
        return window_p99s(fb)

    rows = run(ap_mod.FEEDBACK_GAIN, ap_mod.FALLBACK_SHARE_START)
    assert sum(r["state"] == ap_mod.FALLBACK for r in rows) > 0.7 * len(rows)
    w = windows(rows)
    assert len(w) >= 5 and max(w) <= 1.05 * 60.0, w
    # the static budget (what fallback was before) breaks it on the same load
    assert max(windows(run(0.0, 1.0))) > 1.2 * 60.0
