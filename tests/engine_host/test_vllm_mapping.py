"""CPU tests of the vLLM host's pure parts (no vLLM needed): a SchedulerOutput → StepRecord on
hand-built inputs, the continuous and partial-prefill policies on hand-built queues, the live-knob
limits, the one-line messages for a missing or mismatched vLLM, and `--engine` on the CLI."""

from __future__ import annotations

import importlib.metadata as md
import json
import sys
from types import SimpleNamespace as NS

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from packaging.specifiers import SpecifierSet
from hypothesis import strategies as st

from gpuchef.engine_host import vllm_env, vllm_models
from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.vocab.config import EngineConfig, SchedulerConfig
from gpuchef.engine_host.factory import make_engine
from gpuchef.engine_host.vllm_mapping import (
    ContinuousPlan, QueuedRequest, check_live_knobs, check_startup_knobs, chunked_admission_limit,
    plan_continuous, split_scheduler_output, step_record_from_scheduler_output)

# ------------------------------------------------------------------------------ hand-built outputs


def new_req(rid, prompt_len, computed=0, prefill_len=None):
    """vLLM's NewRequestData: the V1 model runner leaves ``prefill_token_ids`` None, the V2 one
    puts prompt + outputs there."""
    return NS(req_id=rid, num_computed_tokens=computed, prompt_token_ids=list(range(prompt_len)),
              prefill_token_ids=None if prefill_len is None else list(range(prefill_len)))


def cached(*rows, resumed=()):
    """vLLM's CachedRequestData from (req_id, num_computed_tokens, num_output_tokens) rows."""
    return NS(req_ids=[r[0] for r in rows], num_computed_tokens=[r[1] for r in rows],
              num_output_tokens=[r[2] for r in rows], resumed_req_ids=set(resumed))


def sched_out(new=(), cached_reqs=None, tokens=None, preempted=None):
    tokens = dict(tokens or {})
    return NS(scheduled_new_reqs=list(new), scheduled_cached_reqs=cached_reqs or cached(),
              num_scheduled_tokens=tokens, total_num_scheduled_tokens=sum(tokens.values()),
              preempted_req_ids=set(preempted) if preempted is not None else None)


CFG = SchedulerConfig(mode="chunked", max_num_batched_tokens=512, max_num_seqs=8,
                      long_prefill_token_threshold=0, max_num_partial_prefills=1)


def record(so, prompt_lens, targets, **kw):
    base = dict(step=7, t_start_ns=1_000, t_end_ns=3_000_000, gpu_ms=1.5, config=CFG,
                num_running=3, num_waiting=2, kv_blocks_used=10, kv_blocks_total=100)
    base.update(kw)
    return step_record_from_scheduler_output(so, prompt_lens=prompt_lens, prefill_targets=targets,
                                             **base)


def test_new_prompt_scheduled_whole_is_one_prefill():
    targets = {}
    rec = record(sched_out([new_req("a", 100)], tokens={"a": 100}), {"a": 100}, targets)
    assert (rec.num_prefill_reqs, rec.num_prefill_tokens, rec.num_decode_reqs) == (1, 100, 0)
    assert rec.num_partial_prefills == 0 and rec.num_preempted == 0
    assert targets == {"a": 100}
    # the record carries the knobs in force and the caller's figures
    assert (rec.step, rec.mode, rec.max_num_batched_tokens, rec.max_num_seqs) == (7, "chunked",
                                                                                  512, 8)
    assert (rec.num_running, rec.num_waiting, rec.kv_blocks_used, rec.kv_blocks_total) == (3, 2,
                                                                                          10, 100)
    assert rec.gpu_ms == 1.5 and rec.t_end_ns == 3_000_000


def test_chunked_prompt_then_continuing_chunk_then_decode():
    lens, targets = {"a": 1000}, {}
    first = record(sched_out([new_req("a", 1000)], tokens={"a": 512}), lens, targets)
    assert (first.num_prefill_tokens, first.num_partial_prefills) == (512, 1)
    # the next step: a continuing chunk (a cached request, 512 computed before the step)
    second = record(sched_out(cached_reqs=cached(("a", 512, 0)), tokens={"a": 488}), lens, targets)
    assert (second.num_prefill_reqs, second.num_prefill_tokens, second.num_decode_reqs) == (1, 488,
                                                                                          0)
    assert second.num_partial_prefills == 0
    # then decodes: one token at position 1000 (the first sampled token fed back)
    third = record(sched_out(cached_reqs=cached(("a", 1000, 1)), tokens={"a": 1}), lens, targets)
    assert (third.num_prefill_reqs, third.num_prefill_tokens, third.num_decode_reqs) == (0, 0, 1)


def test_mixed_step_decodes_and_a_chunk():
    lens = {"d1": 50, "d2": 60, "c": 900, "n": 300}
    targets = {"d1": 50, "d2": 60, "c": 900}
    so = sched_out([new_req("n", 300)],
                   cached(("d1", 57, 8), ("d2", 60, 1), ("c", 256, 0)),
                   tokens={"d1": 1, "d2": 1, "c": 256, "n": 254})
    rec = record(so, lens, targets)
    assert rec.num_decode_reqs == 2
    assert (rec.num_prefill_reqs, rec.num_prefill_tokens) == (2, 510)
    assert rec.num_partial_prefills == 2  # c (512 of 900 done) and n (254 of 300)
    assert rec.num_tokens == so.total_num_scheduled_tokens


def test_preempted_request_recomputes_prompt_and_outputs_as_prefill():
    # "r" had a 50-token prompt and 5 outputs when it was preempted: vLLM resets its computed
    # tokens to 0 and recomputes all 55 (V1 model runner: it comes back as a resumed cached req).
    lens, targets = {"r": 50}, {"r": 50}
    so = sched_out(cached_reqs=cached(("r", 0, 5), resumed={"r"}), tokens={"r": 40})
    rec = record(so, lens, targets)
    assert (rec.num_prefill_reqs, rec.num_prefill_tokens, rec.num_decode_reqs) == (1, 40, 0)
    assert targets["r"] == 55 and rec.num_partial_prefills == 1
    # its recompute ends with a 1-token chunk: still prefill (position 54 < 55), not a decode
    rec = record(sched_out(cached_reqs=cached(("r", 54, 5)), tokens={"r": 1}), lens, targets)
    assert (rec.num_prefill_reqs, rec.num_prefill_tokens, rec.num_decode_reqs) == (1, 1, 0)
    # then it decodes again at position 55
    rec = record(sched_out(cached_reqs=cached(("r", 55, 6)), tokens={"r": 1}), lens, targets)
    assert (rec.num_prefill_reqs, rec.num_decode_reqs) == (0, 1)


def test_preempted_request_under_the_v2_model_runner_comes_back_as_new():
    # V2 model runner: resumed requests are sent as new ones with prefill_token_ids = all tokens
    lens, targets = {"r": 50}, {"r": 50}
    so = sched_out([new_req("r", 50, prefill_len=55)], tokens={"r": 55})
    rec = record(so, lens, targets)
    assert (rec.num_prefill_tokens, rec.num_decode_reqs) == (55, 0) and targets["r"] == 55


def test_preemptions_are_counted_from_the_output():
    lens, targets = {"a": 10, "b": 10}, {"a": 10}
    so = sched_out(cached_reqs=cached(("a", 12, 3)), tokens={"a": 1}, preempted={"b", "c"})
    rec = record(so, lens, targets)
    assert rec.num_preempted == 2 and rec.num_decode_reqs == 1


def test_prefix_cache_hit_counts_only_the_computed_tokens():
    targets = {}
    rec = record(sched_out([new_req("a", 100, computed=32)], tokens={"a": 68}), {"a": 100},
                 targets)
    assert (rec.num_prefill_tokens, rec.num_partial_prefills) == (68, 0)


def test_empty_step_has_no_record():
    assert record(sched_out(), {}, {}) is None
    # a preemption-only step still schedules nothing: no record
    assert record(sched_out(preempted={"x"}), {"x": 4}, {}) is None


def test_split_counts_every_scheduled_token_once():
    so = sched_out([new_req("n", 20)], cached(("d", 30, 2), ("c", 5, 0)),
                   tokens={"n": 20, "d": 1, "c": 15})
    s = split_scheduler_output(so, {"n": 20, "d": 29, "c": 40}, {"d": 29, "c": 40})
    assert s.num_prefill_tokens + s.num_decode_tokens == s.total_tokens == 36
    assert (s.num_prefill_reqs, s.num_decode_reqs, s.num_partial_prefills) == (2, 1, 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300), st.integers(0, 20), st.integers(0, 400),
                          st.booleans()), min_size=1, max_size=12))
def test_split_partitions_the_tokens(rows):
    """Whatever the mix, prefill + decode tokens = the output's total, and each request's
    prefill tokens never pass its target."""
    lens, targets, crows, tokens, resumed = {}, {}, [], {}, set()
    for i, (plen, nout, computed, is_resumed) in enumerate(rows):
        rid = f"r{i}"
        lens[rid] = plen
        target = plen + nout if is_resumed else plen
        c = min(computed, target + nout)
        if is_resumed:
            resumed.add(rid)
            c = min(c, target - 1)
        else:
            targets[rid] = plen
        crows.append((rid, c, nout))
        tokens[rid] = max(1, target - c) if c < target else 1
    so = sched_out(cached_reqs=cached(*crows, resumed=resumed), tokens=tokens)
    s = split_scheduler_output(so, lens, targets)
    assert s.num_prefill_tokens + s.num_decode_tokens == s.total_tokens
    assert s.num_decode_reqs == s.num_decode_tokens  # one token each, no speculation


# ------------------------------------------------------------------------------ continuous policy


def q(rid, n, bs=16):
    return QueuedRequest(rid, n, -(-n // bs))


def test_continuous_admits_whole_prompts_fcfs_within_the_budget():
    plan = plan_continuous([], 4, [q("a", 300), q("b", 200), q("c", 100)], budget=512,
                           ceiling=2048, max_num_seqs=64, free_blocks=1000)
    # a + b = 500 fit, c would pass 512: admission stops there (no split, no skipping ahead)
    assert plan == ContinuousPlan("prefill", (), 2, 500)


def test_continuous_prefill_step_carries_no_decodes():
    # four running decodes and one waiting prompt: the step prefills only
    plan = plan_continuous([], 4, [q("a", 64)], budget=512, ceiling=2048, max_num_seqs=64,
                           free_blocks=100)
    assert plan.kind == "prefill" and plan.running_ids == () and plan.num_admit == 1


def test_continuous_decodes_when_nothing_can_prefill():
    assert plan_continuous([], 4, [], budget=512, ceiling=2048, max_num_seqs=64,
                           free_blocks=100).kind == "decode"
    # blocks: the head prompt needs 20 blocks, 10 free
    assert plan_continuous([], 4, [q("a", 320)], budget=512, ceiling=2048, max_num_seqs=64,
                           free_blocks=10).kind == "decode"
    # the watermark is kept free for running requests
    assert plan_continuous([], 4, [q("a", 160)], budget=512, ceiling=2048, max_num_seqs=64,
                           free_blocks=12, watermark_blocks=3).kind == "decode"
    # max_num_seqs reached
    assert plan_continuous([], 8, [q("a", 16)], budget=512, ceiling=2048, max_num_seqs=8,
                           free_blocks=100).kind == "decode"
    # vLLM refused the last planned prefill: decode until a request finishes
    assert plan_continuous([], 4, [q("a", 16)], budget=512, ceiling=2048, max_num_seqs=8,
                           free_blocks=100, prefill_blocked=True).kind == "decode"


def test_continuous_head_of_line_prompt_longer_than_the_budget_runs_alone():
    plan = plan_continuous([], 0, [q("a", 900), q("b", 10)], budget=512, ceiling=2048,
                           max_num_seqs=8, free_blocks=1000)
    assert plan == ContinuousPlan("prefill", (), 1, 900)
    # longer than vLLM's start-up budget: chunked, alone
    plan = plan_continuous([], 0, [q("a", 5000), q("b", 10)], budget=512, ceiling=2048,
                           max_num_seqs=8, free_blocks=1000)
    assert plan == ContinuousPlan("prefill", (), 1, 2048, allow_split=True)


def test_continuous_finishes_prompts_left_mid_prefill_whole_first():
    # left mid-prefill by chunked mode before a switch: their remainders come first, whole
    plan = plan_continuous([q("x", 200), q("y", 250)], 5, [q("a", 50), q("b", 100)], budget=512,
                           ceiling=2048, max_num_seqs=64, free_blocks=1000)
    assert plan == ContinuousPlan("prefill", ("x", "y"), 1, 500)
    plan = plan_continuous([q("x", 200), q("y", 400)], 5, [q("a", 50)], budget=512,
                           ceiling=2048, max_num_seqs=64, free_blocks=1000)
    assert plan.running_ids == ("x",) and plan.num_admit == 1 and plan.token_budget == 250


def test_continuous_reads_the_waiting_queue_lazily():
    pulled = []

    def waiting():
        for i in range(10_000):
            pulled.append(i)
            yield q(f"w{i}", 100)
    plan = plan_continuous([], 0, waiting(), budget=512, ceiling=2048, max_num_seqs=64,
                           free_blocks=10_000)
    assert plan.num_admit == 5 and len(pulled) == 6


# ------------------------------------------------------------------------------ partial prefills


def test_partial_prefill_cap_is_free_without_a_threshold():
    assert chunked_admission_limit([], 3, [5000, 5000], budget=512, threshold=0,
                                   max_num_partial_prefills=1, num_running=3,
                                   max_num_seqs=64) is None


def test_partial_prefill_cap_limits_prompts_left_mid_prefill():
    kw = dict(budget=2048, threshold=256, num_running=0, max_num_seqs=64)
    # V1 would give eight 1000-token prompts 256 tokens each: eight partial prefills
    assert chunked_admission_limit([], 0, [1000] * 8, max_num_partial_prefills=1, **kw) == 1
    assert chunked_admission_limit([], 0, [1000] * 8, max_num_partial_prefills=4, **kw) == 4
    # prompts that fit whole are not partial
    assert chunked_admission_limit([], 0, [100] * 5, max_num_partial_prefills=1, **kw) == 5
    # two running prompts already mid-prefill: with cap 2, only whole ones may join
    assert chunked_admission_limit([900, 900], 0, [100, 1000, 100], max_num_partial_prefills=2,
                                   **kw) == 1
    # max_num_seqs bounds it too
    assert chunked_admission_limit([], 0, [10] * 9, max_num_partial_prefills=1, budget=2048,
                                   threshold=256, num_running=6, max_num_seqs=8) == 2


# ------------------------------------------------------------------------------ knob limits


def test_live_knobs_above_the_start_up_values_are_refused():
    lim = dict(max_num_batched_tokens=2048, max_num_seqs=256)
    check_live_knobs(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=256,
                                     long_prefill_token_threshold=100000, mode="continuous",
                                     max_num_partial_prefills=9), **lim)
    with pytest.raises(ConfigError, match=r"max_num_batched_tokens=4096 cannot be set live on "
                                          r"vLLM.*\[1, 2048\].*--max-num-batched-tokens 4096"):
        check_live_knobs(SchedulerConfig(max_num_batched_tokens=4096), **lim)
    with pytest.raises(ConfigError, match=r"max_num_seqs=512 cannot be set live on vLLM"):
        check_live_knobs(SchedulerConfig(max_num_seqs=512), **lim)


def test_start_up_budget_below_max_num_seqs_is_refused():
    with pytest.raises(ConfigError, match="--max-num-batched-tokens 128 must be >= "
                                          "--max-num-seqs 256"):
        check_startup_knobs(SchedulerConfig(max_num_batched_tokens=128, max_num_seqs=256))


# ------------------------------------------------------------------------------ environment


def _installed(monkeypatch, version="0.24.0", requires=("torch==2.11.0", "torchaudio==2.11.0"),
               torch_version="2.11.0+cu130", cuda=True):
    monkeypatch.setattr(vllm_env, "_dist_version", lambda name: version)
    monkeypatch.setattr(vllm_env, "_dist_requires", lambda name: list(requires))
    monkeypatch.setattr(vllm_env, "_torch_version", lambda: torch_version)
    monkeypatch.setattr(vllm_env, "_cuda_available", lambda: cuda)


def _missing(monkeypatch):
    def gone(name):
        raise md.PackageNotFoundError(name)
    monkeypatch.setattr(vllm_env, "_dist_version", gone)
    monkeypatch.setattr(vllm_env, "_find_spec", lambda name: None)


def test_missing_vllm_is_one_line_naming_the_extra(monkeypatch):
    _missing(monkeypatch)
    with pytest.raises(ConfigError) as e:
        make_engine(EngineConfig(engine="vllm"))
    msg = str(e.value)
    assert "vLLM is not installed" in msg and "pip install 'gpuchef[vllm]'" in msg
    assert "\n" not in msg


def test_vllm_that_does_not_import_is_one_line(monkeypatch):
    _installed(monkeypatch)
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "WARNING")  # import_vllm sets these defaults
    monkeypatch.setenv("VLLM_NO_USAGE_STATS", "1")
    assert vllm_env.check_vllm_environment() == "0.24.0"
    with pytest.raises(ConfigError) as e:
        vllm_env.import_vllm("0.24.0")
    msg = str(e.value)
    assert msg.startswith("vLLM 0.24.0 is installed but does not import (ModuleNotFoundError: ")
    assert "pip install 'gpuchef[vllm]'" in msg and "\n" not in msg


def test_torch_mismatch_names_both_versions(monkeypatch):
    _installed(monkeypatch, torch_version="2.13.0+cpu")
    with pytest.raises(ConfigError) as e:
        make_engine(EngineConfig(engine="vllm"))
    msg = str(e.value)
    assert "vLLM 0.24.0 needs torch==2.11.0 but this torch is 2.13.0+cpu" in msg
    assert "\n" not in msg and "vllm" not in sys.modules


def test_no_gpu_is_one_line(monkeypatch):
    _installed(monkeypatch, cuda=False)
    with pytest.raises(ConfigError, match=r"^--engine vllm needs a CUDA GPU and this torch "
                                          r"\(2\.11\.0\+cu130\) sees none"):
        make_engine(EngineConfig(engine="vllm"))


@pytest.mark.parametrize("requires,spec", [
    (["torch==2.11.0", "torchaudio==2.11.0"], "==2.11.0"),
    (["torchvision==0.26.0", "zentorch==2.11.0.0; extra == \"zen\"", "torch (>=2.4,<3)"],
     ">=2.4,<3"),
    (["numpy", "torchaudio"], None),
    (None, None),
    # markers are evaluated as pip does: an extra's line and another platform's are skipped
    (['torch==9.0; extra == "cpu"', 'torch==8.0; sys_platform == "no-such-os"', "torch>=2.4"],
     ">=2.4"),
    (["torch"], None), (["torch ==="], None),  # no specifier; not PEP 508
])
def test_torch_requirement_from_metadata(requires, spec):
    got = vllm_env.torch_requirement(requires)
    if spec is None:
        assert got is None
    else:  # packaging orders the clauses its own way
        assert SpecifierSet(got) == SpecifierSet(spec)


@pytest.mark.parametrize("version,spec,ok", [
    ("2.11.0+cu130", "==2.11.0", True), ("2.11.0", "==2.11.0", True),
    ("2.13.0+cpu", "==2.11.0", False), ("2.11.1", "==2.11.*", True),
    ("2.5.0", ">=2.4,<3", True), ("3.0.0", ">=2.4,<3", False),
    # PEP 440 orders a release candidate before its release; a nightly counts (prereleases)
    ("2.11.0rc1", ">=2.11.0", False), ("2.12.0.dev20260101+cu130", ">=2.11", True),
    ("not-a-version", "==2.11.0", True),  # cannot be judged: not held against the install
])
def test_version_satisfies(version, spec, ok):
    assert vllm_env.version_satisfies(version, spec) is ok


def test_native_engine_still_builds_after_vllm_failed(monkeypatch):
    _missing(monkeypatch)
    with pytest.raises(ConfigError):
        make_engine(EngineConfig(engine="vllm"))
    eng = make_engine(EngineConfig(model="tiny", device="cpu"))
    eng.add_request("r", [5, 6, 7], None)
    while eng.has_unfinished():
        eng.step()
    assert eng.step_id > 0


def test_native_engine_is_single_gpu():
    with pytest.raises(ConfigError, match=r"--tensor-parallel-size 2: gpuchef's native engine "
                                          r"runs on one GPU"):
        make_engine(EngineConfig(model="tiny", device="cpu", tensor_parallel_size=2))
    with pytest.raises(ConfigError, match="--engine 'sglang' is not one of native, vllm"):
        EngineConfig(engine="sglang")


# ------------------------------------------------------------------------------ models


def test_preset_becomes_a_stable_config_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    src = vllm_models.resolve_vllm_model("llama-3-8b")
    assert src.load_format == "dummy" and src.random_weights and src.source == "preset"
    cfg = (tmp_path / "gpuchef" / "vllm-models" / "llama-3-8b" / "config.json")
    assert src.path == str(cfg.parent)
    import json
    assert json.loads(cfg.read_text())["num_hidden_layers"] == 32
    mtime = cfg.stat().st_mtime_ns
    assert vllm_models.resolve_vllm_model("llama-3-8b").path == src.path  # same folder again
    assert cfg.stat().st_mtime_ns == mtime  # not rewritten


def test_local_folder_is_passed_through(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    src = vllm_models.resolve_vllm_model(str(tmp_path))
    assert (src.path, src.load_format, src.random_weights) == (str(tmp_path.resolve()), "dummy",
                                                              True)
    (tmp_path / "model.safetensors").write_bytes(b"")
    src = vllm_models.resolve_vllm_model(str(tmp_path))
    assert (src.load_format, src.random_weights) == ("auto", False)


@pytest.mark.parametrize("hf_eos", [2, [2, 7]])
def test_local_folder_eos_includes_generation_config(tmp_path, hf_eos):
    import torch

    from gpuchef.engine_host.vocab.presets import get_preset
    cfg = {**get_preset("tiny"), "eos_token_id": hf_eos}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": [2, 120]}')
    src = vllm_models.resolve_vllm_model(str(tmp_path))
    assert src.generation_eos == (2, 120)
    _, mc = vllm_models.model_info(src, torch.bfloat16)
    assert mc.eos_token_ids == ((2, 120) if hf_eos == 2 else (2, 7, 120))
    # an architecture gpuchef does not parse keeps the same rule
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["FooForCausalLM"],
                                                      "vocab_size": 200, "eos_token_id": 5}))
    _, mc = vllm_models.model_info(vllm_models.resolve_vllm_model(str(tmp_path)), torch.bfloat16)
    assert mc.eos_token_ids == (5, 2, 120)
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": "</s>"}')
    with pytest.raises(ConfigError, match="generation_config.json.*eos_token_id must be an int"):
        vllm_models.resolve_vllm_model(str(tmp_path))  # refused before vLLM starts


@pytest.mark.parametrize("setup,needle", [
    (lambda p: None, "no config.json in model folder"),
    (lambda p: (p / "config.json").write_text("{oops"), "is not valid JSON"),
    (lambda p: (p / "config.json").write_text("[1]"), "must hold a JSON object"),
])
def test_model_folder_it_cannot_load_is_one_line(tmp_path, setup, needle):
    setup(tmp_path)
    with pytest.raises(ConfigError, match=needle) as e:
        vllm_models.resolve_vllm_model(str(tmp_path))
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="does not exist"):
        vllm_models.resolve_vllm_model(str(tmp_path / "nope"))


# ------------------------------------------------------------------------------ the CLI


def _bench(args, env=None):
    from gpuchef.commands.cli import _register, cli

    _register()
    return CliRunner(env={"COLUMNS": "400", **(env or {})}).invoke(
        cli, ["bench", *args], catch_exceptions=False)


def test_bench_engine_vllm_on_this_cpu_machine_is_one_line_exit_2():
    if vllm_env._cuda_available():
        pytest.skip("a GPU is visible: --engine vllm may really start here")
    r = _bench(["--engine", "vllm", "--num-prompts", "2"])
    assert r.exit_code == 2, r.output
    errors = [line for line in r.output.splitlines() if "error:" in line]
    assert len(errors) == 1, r.output
    assert "vllm" in errors[0].lower() and "--engine native" in errors[0]
    assert "Traceback" not in r.output
    if "not installed" in errors[0]:
        assert "pip install 'gpuchef[vllm]'" in errors[0]  # brackets survive Rich markup


def test_bench_native_tensor_parallel_is_one_line_exit_2():
    r = _bench(["--device", "cpu", "--tensor-parallel-size", "2", "--num-prompts", "2"])
    assert r.exit_code == 2
    assert "native engine runs on one GPU" in r.output and "Traceback" not in r.output


def test_bench_help_lists_the_engine_flags():
    r = _bench(["--help"])
    assert "--engine [native|vllm]" in r.output and "--tensor-parallel-size" in r.output
