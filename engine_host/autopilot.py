"""The autopilot: an SLO-aware controller of the chunked scheduler's prefill token allowance.

Before each chunked step, once the running decodes have their tokens, :class:`Autopilot` picks
how many prefill tokens the step may carry (its *allowance*): as many as keep the step's
predicted time (= the ITL its decodes see) within the ITL target, more when a waiting request's
TTFT target is at risk. It changes when tokens are computed, never which tokens.

**The step-time model** (:class:`StepTimeModel`), fitted online to the engine's own steps::

    t_ms ≈ θ·x,  x = [1, mixed, D/64, P/512, Cd/2^16, Cp/2^20]

``mixed`` = 1 when the step carries prefill (a prefill plan, no CUDA graph), ``D`` decode rows,
``P`` prefill tokens, ``Cd`` = Σ context length read by the decode rows (tokens), ``Cp`` = Σ
over prefill chunks of n·(o + (n+1)/2) query-key pairs (a chunk of n tokens at offset o,
causal). The terms follow how a transformer step's cost splits — weights read once per step,
GEMM work per token, attention work per row's context — the split Sarathi-Serve (Agrawal et al.,
OSDI 2024, §3) reasons with; a linear model of them is the simplest that can be fitted in
microseconds, not a claim that the GPU is linear: its error is tracked and the controller steps
aside when it is large. It is fitted by exponentially weighted least squares,
the recursive-least-squares problem with forgetting factor λ (Ljung & Söderström, *Theory and
Practice of Recursive Identification*, 1983, §2.6; Haykin, *Adaptive Filter Theory*, ch. 10),
solved in information form with a regularisation toward the last estimate added each step,
(1−λ)·δ·(θ_prev − θ), so that a direction the load stops exciting keeps its value instead of
winding up (Gunnarsson, "Combining tracking and regularization in recursive least squares
identification", CDC 1996). The fit error is the a-priori relative error |t − t̂|/t of each
step, exponentially averaged; residuals beyond 4× that (and beyond 25 % of the prediction) are
clipped (Huber) so that one stall (GC, a noisy neighbour) does not drag the fit.

**The rule**: with the decodes placed, the fixed part f = t̂(D, Cd, P=0) + θ_mixed is known;
the allowance is the largest P with f + θ_P·P + θ_Cp·(P·o + P²/2) ≤ g (a quadratic; o is the
offset of the first prefill in line), where the goal g = ITL target / (1 + z·σ), σ = 1.25 × the
mean relative error (σ of a normal error) and z its quantile for the target's statistic (p99:
2.33; median/mean: 0), so that the target's quantile, not the mean, stays under the target.
With a TTFT target, each request in line for prefill (the running partial prefills, then up to
32 waiting; looked at every 4th step) with age a and T prefill tokens ahead of its first token
(its own included) needs T·(f/P + c) ≤ g_ttft − a, i.e. P ≥ T·f/(g_ttft − a − T·c), when every
step of the T/P it waits costs f + c·P; the allowance is raised toward the
largest such P among the requests that the full budget could still serve in time (a request
already past rescue is not chased at every decode's expense), but only as far as the predicted
step time stays within κ × the ITL target (never the target itself): the relaxation spends
the model's margin only as far as the feedback finds it unused.

**The feedback** (the ITL target is a promise: its statistic over the tokens the decodes see,
not the model's prediction of a step): each steered step's decode rows report the gap they saw
since their previous token (``itl_ms``: the step plus the engine's own work between steps,
which the model of the step's own time does not see), and ln κ moves by η·D·(aim − 1[gap > target]) for D decode rows
(η = ``FEEDBACK_GAIN``, at most ``FEEDBACK_MAX_STEP`` a step, so a stall of any length moves
κ by a bounded amount): the Robbins–Monro stochastic approximation of the level at which the
share of tokens over the target equals ``aim`` (Robbins & Monro, "A stochastic approximation
method", Ann. Math. Stat. 1951; the same recursion tracks a quantile), aim = ``ITL_AIM`` × (1 −
q) for the statistic's quantile q (p99: 0.5 %, half of what p99 allows, so a 30 s window's
share stays within it). The goal is g = target × min(1, κ/(1 + z·σ)), κ in [``KAPPA_MIN``,
1 + z·σ]: where the model's margin is too small (a step time it cannot fit, such as long
chunks whose cost is not linear, the engine's gap between steps, the TTFT relaxation) κ falls
below 1; where it is too large κ rises until the goal reaches the target. Only steered steps
move it; new targets reset it. Guards: the allowance is never
above the budget left after the decodes (``max_num_batched_tokens``, the user's cap), never below
``MIN_PREFILL_ALLOWANCE`` tokens (prefill never starves) unless that would put a step whose
decodes fit under the target over it (then the largest allowance within the target, at least
one token); while the model is not fitted (fewer
than ``MIN_STEPS`` steps or ``MIN_PREFILL_STEPS`` with prefill, or a prefill coefficient ≤ 0)
it learns with allowances of 1/8, 1/4 and 1/2 of the budget left in turn (within the static
budget: the fit sees every size, and a prompt gives several prefill steps), and while its error
is over ``ERROR_LEAVE`` (until back under ``ERROR_ENTER``) there is no model to steer by: the
allowance is a share of the budget left (a quarter at first) that the same feedback moves from
the measured ITL alone (``log_share``, within [``FALLBACK_SHARE_MIN``, 1]), so the promise is
kept without a model, at the TTFT's expense, until the model is trusted again.
**Infeasible**: when the fitted model predicts the step's fixed part f (its decodes, before
any prefill token: t̂(P=0) + θ_mixed), plus the engine's mean time between steps that the
decodes' ITL also holds (``gap_ms``, from itl − wall), over ``INFEASIBLE_ENTER`` × the ITL
target, no allowance
can meet the target — shrinking the prefill only starves the queue, its TTFT growing without
bound — so the static budget is in force (the TTFT is what can still be served) until f is
predicted within ``INFEASIBLE_LEAVE`` × the target (hysteresis: f moves by a row or two a
step). f, not t̂ of a decode-only step: when every step carries prefill (as it does here) the
fit cannot split the intercept between ``1`` and ``mixed``; their sum it knows.
``notify`` is told of each change ("warning"/"notice", a message). The states are ``STATES``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from itertools import islice
from statistics import NormalDist
from typing import TYPE_CHECKING, Callable

import numpy as np

from .vocab.config import AutoBudgetSpec

try:  # numpy's gufunc behind np.linalg.solve, without its ~5 µs of argument checks per call
    from numpy.linalg._umath_linalg import solve1 as _solve
except ImportError:  # a numpy that moved it: the public function, same result
    _solve = np.linalg.solve

if TYPE_CHECKING:  # the scheduler imports this module
    from .scheduler import Scheduler, SchedulerOutput

FEATURES = ("1", "mixed", "decode_rows", "prefill_tokens", "decode_context", "prefill_context")
#: Feature scales: x = raw / scale, so that every feature is O(1) at real loads.
SCALES = (1.0, 1.0, 64.0, 512.0, float(1 << 16), float(1 << 20))
FORGETTING = 0.95          # λ: memory ≈ 1/(1−λ) = 20 steps
REGULARISATION = 0.1       # δ
HUBER_FLOOR = 0.25         # residuals are clipped at max(4 × error, 25 %) of the prediction
ERROR_ALPHA = 0.05         # weight of the newest step in the mean relative error (~20 steps)
MIN_STEPS = 24
ERROR_FROM_STEP = 8        # the error is tracked from the 9th step fitted (θ has data by then)
MIN_PREFILL_STEPS = 8
ERROR_ENTER = 0.30         # the controller takes over at or below this mean relative error
ERROR_LEAVE = 0.50         # and hands back to the static budget above this
MIN_PREFILL_ALLOWANCE = 64  # tokens per step, or the budget left if smaller
LEARN_SHIFTS = (3, 2, 1)    # while fitting: the budget left / 8, / 4, / 2 in turn
TTFT_SCAN = 32             # waiting requests looked at for TTFT risk
TTFT_EVERY = 4             # steps between two looks (its answer holds in between)
MIN_GOAL_SHARE = 0.5       # the headroom never takes the goal below half the target
INFEASIBLE_ENTER = 1.10    # the fixed part f predicted over 1.1 × the ITL target: infeasible
INFEASIBLE_LEAVE = 1.00    # and feasible again once f is predicted within the target
ITL_AIM = 0.5              # aim the share of decode tokens over the ITL target at half what the
                           # target's statistic allows (p99: 0.5 %), so a window's share holds
FEEDBACK_GAIN = 1e-3       # change of ln κ per decode token (a step of 64 rows over: −6 %)
FEEDBACK_MAX_STEP = 0.1    # and at most this much per step (one stall moves κ by ≤ 10 %)
KAPPA_MIN = 0.25           # the feedback never takes the goal below a quarter of the target
FALLBACK_SHARE_MIN = 1.0 / 64  # in fallback, the share of the budget left is at least this,
FALLBACK_SHARE_START = 0.25    # and starts here (the learning sizes' middle: the feedback cuts
                               # in a few steps what it raises only over thousands)

#: The autopilot's states (``Autopilot.state``, ``StepRecord.autopilot_state``), the one
#: spelling of each; ``STATES`` gives each its meaning: what the step's allowance was.
OFF = ""
LEARNING = "learning"
STEERING = "steering"
INFEASIBLE = "infeasible"
FALLBACK = "fallback"
STATES = (
    (OFF, "off: the static budget, no allowance"),
    (LEARNING, "the model is not fitted yet: 1/8, 1/4, 1/2 of the budget left in turn"),
    (STEERING, "the model chose: the largest allowance within the ITL target (more for a TTFT "
               "at risk)"),
    (INFEASIBLE, "the model predicts the decodes alone (before any prefill) over the ITL "
                 "target: the static budget, for TTFT"),
    (FALLBACK, "the model is fitted but its error is too large: a share of the budget left "
               "that the measured ITL alone sets (cut when tokens miss the target)"),
)
STATE_MEANING = dict(STATES)
#: The states in which the model did not choose the allowance (the report shades them).
NOT_STEERING = (LEARNING, INFEASIBLE, FALLBACK)


Notify = Callable[[str, str], None]


def _noop(kind: str, message: str) -> None:
    pass


def stat_quantile(stat: str) -> float:
    """The quantile a target's statistic names: ``p99`` → 0.99, ``median`` → 0.5; ``mean`` →
    0.5 (a step-time distribution skewed right has its mean above its median, so the feedback
    holds the mean under the target by holding the share over it at a quarter)."""
    if stat.startswith("p"):
        return min(max(float(stat[1:]) / 100.0, 0.0), 1.0)
    return 0.5


def stat_z(stat: str) -> float:
    """The normal quantile for a target's statistic: ``p99`` → 2.33, ``median``/``mean``/p≤50 → 0."""
    if stat.startswith("p"):
        q = float(stat[1:]) / 100.0
        if q <= 0.5:
            return 0.0
        return NormalDist().inv_cdf(min(q, 0.9999))
    return 0.0


class StepTimeModel:
    """Exponentially weighted, regularised least squares for ``t_ms ≈ θ·x`` (see the module
    docstring). ``x``: a length-6 sequence of scaled features (``features``). All times ms."""

    def __init__(self, forgetting: float = FORGETTING, regularisation: float = REGULARISATION) -> None:
        if not 0.0 < forgetting <= 1.0:
            raise ValueError(f"forgetting factor {forgetting} is out of range: allowed (0, 1]")
        n = len(FEATURES)
        self.lam = forgetting
        self.delta = regularisation
        # [R | r] in one 6×7 array, so that each step's update is three numpy calls, not nine
        self._A = np.zeros((n, n + 1))
        self.R = self._A[:, :n]
        self.r = self._A[:, n]
        self.R[:] = np.eye(n) * regularisation
        self.theta = np.zeros(n)
        self._th = [0.0] * n  # θ as floats: predict() runs twice a step, numpy scalars are slow
        self._reg = (1.0 - forgetting) * regularisation
        # what each step adds besides x·[x, y]: [(1−λ)δ I | (1−λ)δ θ_prev]
        self._Z = np.zeros((n, n + 1))
        self._Z[:, :n] = np.eye(n) * self._reg
        self._outer = np.empty((n, n + 1))
        self._xa = np.empty(n + 1)  # [x, y] of the step being fitted; _xcol: x as a column
        self._xcol = self._xa[:n, None]
        self.n = 0              # steps fitted
        self.n_prefill = 0      # of them, steps with prefill
        self.error = 1.0        # mean relative a-priori error (fraction); 1 until fitted
        self._err_n = 0

    @staticmethod
    def features(decode_rows: int, prefill_tokens: int, decode_ctx: int, prefill_ctx: float) -> tuple:
        """Scaled features of a step (tokens; ``prefill_ctx`` in query-key pairs)."""
        return (1.0, 1.0 if prefill_tokens else 0.0, decode_rows / 64.0, prefill_tokens / 512.0,
                decode_ctx / 65536.0, prefill_ctx / 1048576.0)

    def predict(self, x) -> float:
        th = self._th
        return (th[0] * x[0] + th[1] * x[1] + th[2] * x[2] + th[3] * x[3] + th[4] * x[4]
                + th[5] * x[5])

    def update(self, x, y_ms: float) -> float:
        """Fit one step of ``y_ms``; returns the a-priori prediction it was judged against."""
        pred = self.predict(x)
        if self._err_n >= MIN_STEPS - ERROR_FROM_STEP:
            # Huber: a stall far outside the tracked error moves the fit by a bounded amount
            lim = max(4.0 * self.error, HUBER_FLOOR) * max(abs(pred), 1e-3)
            y_fit = min(max(y_ms, pred - lim), pred + lim)
        else:
            y_fit = y_ms
        if y_ms > 0 and self.n >= ERROR_FROM_STEP:  # a-priori errors of a model with data
            e = min(abs(y_ms - pred) / y_ms, 4.0)
            self._err_n += 1
            if self._err_n <= MIN_STEPS - ERROR_FROM_STEP:  # plain mean first, then exponential
                self.error = e if self._err_n == 1 else self.error + (e - self.error) / self._err_n
            else:
                self.error += ERROR_ALPHA * (e - self.error)
        # R ← λR + x xᵀ + (1−λ)δ I,  r ← λr + x y + (1−λ)δ θ,  θ = R⁻¹ r, on [R | r] in place
        # (µs count; each element gets the same operations in the same order as written)
        xa = self._xa
        xa[:-1] = x
        xa[-1] = y_fit
        A = self._A
        A *= self.lam
        A += np.multiply(self._xcol, xa, out=self._outer)
        A += self._Z
        self.theta = _solve(self.R, self.r)
        np.multiply(self.theta, self._reg, out=self._Z[:, -1])  # the next step's (1−λ)δ θ
        self._th = self.theta.tolist()
        self.n += 1
        if x[1]:
            self.n_prefill += 1
        return pred

    def coefficients(self) -> dict[str, float]:
        """θ in raw units: ms, ms per mixed step, per decode row, per prefill token, per context
        token, per query-key pair."""
        return {f: float(t / s) for f, t, s in zip(FEATURES, self.theta, SCALES)}

    @property
    def fitted(self) -> bool:
        return (self.n >= MIN_STEPS and self.n_prefill >= MIN_PREFILL_STEPS
                and self._err_n > 0 and self._th[3] > 0.0)


@dataclass(slots=True)
class Decision:
    """What the autopilot decided for one chunked step, returned by :meth:`Autopilot.choose`
    and completed by :meth:`Autopilot.finish` (the scheduler hands it on as
    ``SchedulerOutput.autopilot``; the engine copies it into the StepRecord and gives it back
    to :meth:`Autopilot.observe` with the step's times).

    ``allowance``: prefill tokens the step may carry; ``state``: one of ``STATES``;
    ``goal_ms``: the step time it aimed under (ms; -1 when it did not steer);
    ``predicted_ms``: the model's prediction for the step as scheduled (ms; -1 before
    ``MIN_STEPS``); ``fit_error``: the model's tracked mean relative error (fraction; -1 not
    tracked yet); ``features``: the step's scaled features (``StepTimeModel.features``);
    ``decode_ctx``: Σ context of the decode rows (tokens)."""

    allowance: int
    state: str
    decode_ctx: int
    goal_ms: float = -1.0
    predicted_ms: float = -1.0
    fit_error: float = -1.0
    features: tuple = ()


class Autopilot:
    """Chooses each chunked step's prefill allowance (see the module docstring).

    ``spec``: the targets (``config.parse_auto_budget``). ``notify(kind, message)`` hears status
    changes: kind "warning" (not steering by the model: not fitted, or its error too large)
    or "notice" (the controller steers). Called on the engine thread; must be cheap.
    """

    def __init__(self, spec: AutoBudgetSpec, notify: Notify | None = None,
                 model: StepTimeModel | None = None) -> None:
        self.model = model or StepTimeModel()
        self.notify = notify or _noop
        self.active = False
        #: what the step being scheduled got: one of ``STATES`` (never ``OFF``)
        self.state = LEARNING
        self.infeasible = False  # the decodes alone predicted over the ITL target (hysteresis)
        self.last_allowance = -1
        #: the feedback's factor on the goal (ln κ kept; see the module docstring)
        self.log_kappa = 0.0
        #: in fallback: ln of the share of the budget left the allowance is (the same feedback)
        self.log_share = _LOG_SHARE_START
        #: the engine's own time between steps, as the decodes see it (ms): mean of itl − wall
        self.gap_ms = 0.0
        self.clock: Callable[[], int] = time.monotonic_ns  # the requests' arrival clock (ns)
        self._ttft_age = TTFT_EVERY  # steps since the TTFT need was worked out
        self._learn_i = 0
        self._ttft_p = 0.0
        self.set_spec(spec)
        self.notify("warning", f"autopilot ({spec.canonical}): fitting the step-time model "
                               f"(needs {MIN_STEPS} steps, {MIN_PREFILL_STEPS} with prefill) with "
                               "1/8 to 1/2 of the static budget; not steering until then")

    def set_spec(self, spec: AutoBudgetSpec) -> None:
        """New targets; the fitted model is kept (the step time does not depend on them), the
        feedback starts afresh (its factor belongs to the old target's statistic)."""
        self.spec = spec
        self.canonical = spec.canonical  # the scheduler compares it with its config's each step
        self._z_itl = stat_z(spec.itl_stat)
        self._z_ttft = stat_z(spec.ttft_stat)
        self._aim = max(ITL_AIM * (1.0 - stat_quantile(spec.itl_stat)), 1e-4)
        self.log_kappa = 0.0
        self.log_share = _LOG_SHARE_START

    @property
    def kappa(self) -> float:
        """The feedback's factor κ on the model's goal (1 = the model's own margin)."""
        return math.exp(self.log_kappa)

    # -- per step ------------------------------------------------------------------------------
    def _share(self, z: float) -> float:
        """The model's own margin: the share of a target its prediction may take (see
        ``_goal``)."""
        return max(MIN_GOAL_SHARE, 1.0 / (1.0 + z * (1.25 * self.model.error)))

    def _goal(self, target_ms: float, z: float) -> float:
        return target_ms * self._share(z)

    def itl_goal(self) -> float:
        """The step time the ITL rule aims under (ms): the target × the model's margin × κ,
        never above the target itself."""
        return self.spec.itl_ms * min(1.0, self._share(self._z_itl) * math.exp(self.log_kappa))

    def choose(self, sched: "Scheduler", out: "SchedulerOutput", budget_left: int) -> Decision:
        """The decision for the step being scheduled: its prefill allowance (tokens, ≤
        ``budget_left``) and state; its decodes are in ``out``."""
        decodes = out.decodes
        nd = len(decodes)
        # (a list, not map(attrgetter) nor the scheduler's decode pass: 4.8 vs 6.3 µs for
        # 256 decodes, and carried by the decode pass it cost that pass 4.5 µs, on or off)
        ctx = sum([r.num_computed_tokens for r in decodes]) + nd
        if budget_left <= 0:
            return Decision(0, self.state, ctx)
        self._update_status()
        if not self.active:
            if self.model.fitted:  # fitted, but its error is too large: no model to steer by,
                # so the measured ITL alone sets a share of the budget left (from a quarter)
                self.state = FALLBACK
                p = int(budget_left * math.exp(self.log_share))
                return Decision(max(min(MIN_PREFILL_ALLOWANCE, budget_left), p), FALLBACK, ctx)
            # learning: step sizes of 1/8, 1/4, 1/2 of the budget left in turn — every size the
            # fit needs to see, more prefill steps per prompt, never above the static budget
            self.state = LEARNING
            self._learn_i = (self._learn_i + 1) % len(LEARN_SHIFTS)
            return Decision(max(min(MIN_PREFILL_ALLOWANCE, budget_left),
                                budget_left >> LEARN_SHIFTS[self._learn_i]), LEARNING, ctx)
        th = self.model._th
        fixed = th[0] + th[1] + th[2] * nd / 64.0 + th[4] * ctx / 65536.0
        # what the decodes alone would see: their step plus the engine's time between steps
        seen = fixed + self.gap_ms
        if self._infeasible(seen):
            self.state = INFEASIBLE  # no allowance meets the ITL target: serve the TTFT
            return Decision(budget_left, INFEASIBLE, ctx)
        self.state = STEERING
        # the prefills in line: with budget left, every running request not in prefill got its
        # decode (the stall-free rule), so they are the running requests not in ``decodes``
        # (the newest admitted, mostly: looked for from the end)
        line = []
        k = len(sched.running) - nd
        if k:
            for r in reversed(sched.running):
                if r.num_computed_tokens < r.prefill_target:
                    line.append(r)
                    if len(line) == k:
                        break
            line.reverse()
        c = th[3] / 512.0                       # ms per prefill token
        e = max(th[5], 0.0) / 1048576.0         # ms per query-key pair
        o = line[0].num_computed_tokens if line else 0
        b = c + e * o
        itl = self.spec.itl_ms
        goal = self.itl_goal()
        p = _largest_p(goal - fixed, b, e / 2.0)
        if self.spec.ttft_ms is not None and p < budget_left:
            self._ttft_age += 1
            if self._ttft_age >= TTFT_EVERY:  # the line moves by a few requests a step
                self._ttft_age = 0
                self._ttft_p = self._ttft_need(sched, line, fixed, c, budget_left)
            if self._ttft_p > p:
                # TTFT at risk: spend the model's margin, as far as the feedback finds it unused
                # (κ·target: the measured share over the target stays at the aim), never the
                # target itself
                ceiling = itl * min(1.0, math.exp(self.log_kappa))
                if ceiling > goal:
                    goal = ceiling
                    p = min(self._ttft_p, _largest_p(ceiling - fixed, b, e / 2.0))
        # the floor keeps prefill moving when the decodes leave less, but within the target
        # itself while the decodes alone fit under it (the ITL target is the promise)
        floor = min(MIN_PREFILL_ALLOWANCE, budget_left)
        if seen <= itl and p < floor:
            floor = max(1, min(floor, int(_largest_p(itl - seen, b, e / 2.0))))
        return Decision(max(floor, min(int(p), budget_left)), STEERING, ctx, goal_ms=goal)

    def _infeasible(self, fixed_ms: float) -> bool:
        """Whether the step's fixed part, predicted at ``fixed_ms`` (its decodes plus what a
        step with prefill costs before its first prefill token), puts the ITL target out of
        reach: entered above ``INFEASIBLE_ENTER`` × the target, left at or below
        ``INFEASIBLE_LEAVE`` ×; each change announced."""
        itl = self.spec.itl_ms
        if self.infeasible:
            if fixed_ms <= INFEASIBLE_LEAVE * itl:
                self.infeasible = False
                self._ttft_age = TTFT_EVERY  # the TTFT need is worked out afresh at once
                self.notify("notice", f"autopilot: the decodes are predicted at {fixed_ms:.1f} "
                                      f"ms before any prefill, within the ITL target {itl:g} ms "
                                      f"again: choosing the prefill allowance for "
                                      f"{self.spec.canonical}")
        elif fixed_ms > INFEASIBLE_ENTER * itl:
            self.infeasible = True
            self.notify("warning", f"autopilot: the decodes are predicted at {fixed_ms:.1f} ms "
                                   f"before any prefill, over the ITL target {itl:g} ms: no "
                                   "prefill allowance can meet it, so the static budget is in "
                                   "force (for TTFT) until they are predicted within "
                                   f"{INFEASIBLE_LEAVE * itl:g} ms")
        return self.infeasible

    def _ttft_need(self, sched: "Scheduler", line: list, fixed: float, c: float,
                   cap: int) -> float:
        """The least allowance that serves every rescuable request in line (``line``: the
        running prefills, then the first ``TTFT_SCAN`` waiting) within the TTFT goal (0 when
        none is at risk)."""
        goal = self._goal(self.spec.ttft_ms, self._z_ttft)
        now = self.clock()
        ahead = 0
        need = 0.0
        for r in line:
            ahead += r.prefill_target - r.num_computed_tokens
            if not r.output_token_ids:  # a preempted request's first token is out already
                room = goal - (now - r.arrival_ns) / 1e6 - ahead * c
                work = ahead * fixed
                if room > 0 and work <= cap * room and work / room > need:
                    need = work / room
        for r in islice(sched.waiting, TTFT_SCAN):
            out_ids = r.output_token_ids
            ahead += len(r.prompt_token_ids) + len(out_ids)
            if not out_ids:
                room = goal - (now - r.arrival_ns) / 1e6 - ahead * c
                work = ahead * fixed
                if room > 0 and work <= cap * room and work / room > need:
                    need = work / room
        return math.ceil(need)

    def finish(self, out: "SchedulerOutput", d: Decision) -> Decision:
        """Complete ``d`` with the scheduled step's features, predicted time and fit error;
        returns it."""
        pt = 0
        pctx = 0.0
        for r, n in out.prefills:
            pt += n
            pctx += n * (r.num_computed_tokens + (n + 1) / 2.0)
        x = StepTimeModel.features(len(out.decodes), pt, d.decode_ctx, pctx)
        d.features = x
        m = self.model
        d.predicted_ms = float(m.predict(x)) if m.n >= MIN_STEPS else -1.0
        d.fit_error = float(m.error) if m._err_n else -1.0
        self.last_allowance = d.allowance
        return d

    def observe(self, d: Decision, wall_ms: float, itl_ms: float = -1.0,
                decode_rows: int = 0) -> None:
        """Learn from one executed step: ``d`` its decision, ``wall_ms`` its measured time
        (ms), ``itl_ms`` the gap its ``decode_rows`` decode rows saw since their previous token
        (ms; -1 when it has none). The model is fitted to ``wall_ms`` (the step's own time,
        which its features explain); a step the controller steered moves the feedback with
        ``itl_ms`` (what the promise is about: the step plus the engine's own work between
        steps; see the module docstring)."""
        self.model.update(d.features, wall_ms)
        if itl_ms > 0:
            self.gap_ms += ERROR_ALPHA * (max(0.0, itl_ms - wall_ms) - self.gap_ms)
        if itl_ms <= 0 or d.state not in (STEERING, FALLBACK):
            return
        over = 1.0 if itl_ms > self.spec.itl_ms else 0.0
        move = min(FEEDBACK_GAIN * decode_rows, FEEDBACK_MAX_STEP) * (over - self._aim)
        if d.state == STEERING:
            # κ within [KAPPA_MIN, the value that puts the goal at the target itself]
            hi = -math.log(self._share(self._z_itl))
            self.log_kappa = min(max(self.log_kappa - move, _LOG_KAPPA_MIN), hi)
        else:  # fallback: the share of the budget left, within [FALLBACK_SHARE_MIN, 1]
            self.log_share = min(max(self.log_share - move, _LOG_SHARE_MIN), 0.0)

    def _update_status(self) -> None:
        m = self.model
        if self.active:
            if not m.fitted or m.error > ERROR_LEAVE:
                self.active = False
                self.infeasible = False  # judged afresh when it steers again
                why = (f"error {m.error:.0%} > {ERROR_LEAVE:.0%}" if m.fitted
                       else "prefill coefficient not positive")
                self.notify("warning", f"autopilot: step-time model {why}: the measured ITL "
                                       "alone sets the allowance (a share of the budget left) "
                                       f"until the error is ≤ {ERROR_ENTER:.0%}")
        elif m.fitted and m.error <= ERROR_ENTER:
            self.active = True
            self.notify("notice", f"autopilot: step-time model fitted ({m.n} steps, error "
                                  f"{m.error:.0%}); choosing the prefill allowance for "
                                  f"{self.spec.canonical}")


_LOG_KAPPA_MIN = math.log(KAPPA_MIN)
_LOG_SHARE_MIN = math.log(FALLBACK_SHARE_MIN)
_LOG_SHARE_START = math.log(FALLBACK_SHARE_START)


def _largest_p(slack: float, b: float, a: float) -> float:
    """The largest P ≥ 0 with a·P² + b·P ≤ slack (0 if none; inf if unbounded)."""
    if slack <= 0:
        return 0.0
    if a > 1e-15:
        return (-b + math.sqrt(b * b + 4.0 * a * slack)) / (2.0 * a)
    if b <= 0:
        return math.inf
    return slack / b
