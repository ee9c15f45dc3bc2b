"""Several GPUs in `gpuchef top`: one row per GPU, a mean and a spread row, over a static
session with a fake 8-GPU sample source; and `--gpus` errors through the CLI."""

import asyncio

import numpy as np
from click.testing import CliRunner
from tui_fakes import StaticSession, settle

from gpuchef.commands.cli import _register, cli
from gpuchef.tui.app import GpuchefApp
from gpuchef.tui.plotdata import GpuColumns, TimeGrid, build_frame
from gpuchef.tui.widgets.waveforms import PerGpuPanel


def rank3_slow(k, sm):
    """GPU 3 at 90 % SM active, the others at 10 %."""
    return 90.0 if k == 3 else 10.0


def ramp(k, sm):
    """Each GPU a little less busy than the one before: an imbalanced TP group."""
    return sm * (1.0 - 0.1 * k)


def fake8(gpu_sm=ramp):
    return StaticSession(gpu=True, n_gpus=8, gpu_sm=gpu_sm,
                         gpu_label="fake 8-GPU sample source")


def app(session, window_s=60.0):
    return GpuchefApp(session, window_s=window_s, show_ui_cost=False)




def test_8_gpus_120x40(snap_compare):
    assert snap_compare(app(fake8()), terminal_size=(120, 40), run_before=settle)


def test_8_gpus_200x60(snap_compare):
    assert snap_compare(app(fake8()), terminal_size=(200, 60), run_before=settle)


def test_frame_keeps_each_gpu_apart():
    s = fake8(rank3_slow)
    snap = s.timeline.snapshot(s.now)
    grid = TimeGrid.ending_at(s.now, s.start_ns, 10.0, 50)
    cols = GpuColumns()
    cols.extend(snap)
    assert cols.indices == list(range(8))
    f = build_frame(snap, grid, gpus=cols)
    assert sorted(f.per_gpu) == list(range(8))
    assert np.nanmean(f.per_gpu[3]["sm_active"]) == 90.0
    assert np.nanmean(f.per_gpu[0]["sm_active"]) == 10.0
    assert abs(np.nanmean(f.gpu["sm_active"]) - 20.0) < 1e-9  # pooled mean
    assert abs(np.nanmean(f.per_gpu[5]["mem_used_pct"]) - 100 * 65 / 141) < 1e-9


def test_one_gpu_has_no_per_gpu_rows():
    s = StaticSession(gpu=True)
    snap = s.timeline.snapshot(s.now)
    f = build_frame(snap, TimeGrid.ending_at(s.now, s.start_ns, 10.0, 50))
    assert f.per_gpu == {}


def test_rows_show_each_gpu_and_the_spread():
    a = app(fake8(rank3_slow))

    async def go():
        async with a.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            panel = a.screen.query_one(PerGpuPanel)
            assert panel.display
            assert not a.screen.query_one("#gpu").display
            assert not a.screen.query_one("#mem").display
            return [panel.render_line(y).text for y in range(panel.size.height)]

    lines = asyncio.run(go())
    assert len(lines) == 8 + 3
    rows = {ln.split()[0] + (ln.split()[1] if ln.startswith("GPU") else ""): ln
            for ln in lines[1:]}
    assert "GPU3" in rows and "mean" in rows and "spread" in rows
    # SM active, tensor active (0.8 × SM), DRAM (10 + 0.6 × SM), memory, power
    assert rows["GPU3"].split()[-5:] == ["90%", "72%", "64%", "45%", "560W"]
    for k in (0, 1, 2, 4, 5, 6, 7):
        assert rows[f"GPU{k}"].split()[-5][:3] == "10%", rows[f"GPU{k}"]
    assert rows["mean"].split()[-5] == "20%"
    assert "80%" in rows["spread"] and "hi GPU 3" in rows["spread"]


def test_one_gpu_keeps_the_pooled_panels():
    a = app(StaticSession(gpu=True))

    async def go():
        async with a.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            assert not a.screen.query_one(PerGpuPanel).display
            assert a.screen.query_one("#gpu").display and a.screen.query_one("#mem").display

    asyncio.run(go())


def run(*args):
    _register()
    return CliRunner().invoke(cli, ["top", "--device", "cpu", *args])


def test_bad_gpus_are_refused_in_one_line():
    for spec, msg in (("x", "'x' is not a GPU index"), ("3-1", "--gpus '3-1'"),
                      ("0,,a", "'a' is not a GPU index")):
        r = run("--gpus", spec)
        assert r.exit_code == 2, (spec, r.output)
        assert msg in " ".join(r.output.split()), (spec, r.output)


def _live(gpus):
    """A LiveSession on the tiny CPU engine with a fake 8-GPU NVML (GPU 3 at 90 % SM active,
    the others at 10 %), sampling ``gpus`` (None = all)."""
    from gpuchef.engine_host.vocab.config import CacheConfig, EngineConfig
    from gpuchef.engine_host.engine import LLMEngine
    from gpuchef.engine_host.vocab.workload import WorkloadConfig
    from gpuchef.sessions.live import LiveSession
    from gpuchef.probes.nvml.fake import FakeNvml

    fake = FakeNvml(n_gpus=8, pcie_window_s=0)
    for k in range(8):
        fake.set_load(k, sm_active=90.0 if k == 3 else 10.0)
    engine = LLMEngine(EngineConfig(model="tiny", device="cpu", max_model_len=512,
                                    cache=CacheConfig(num_gpu_blocks=256)))
    wcfg = WorkloadConfig(dataset="random", request_rate=2.0, input_len=16, output_len=4,
                          num_prompts=4, vocab_size=engine.model_config.vocab_size,
                          max_model_len=engine.max_model_len)
    return LiveSession(engine, wcfg, nvml=fake, gpus=gpus, host_probe=False, sample_hz=20)


def _live_rows(gpus, want):
    s = _live(gpus)
    a = GpuchefApp(s, window_s=10, show_ui_cost=False)

    async def go():
        async with a.run_test(size=(120, 40)) as pilot:
            panel = a.screen.query_one(PerGpuPanel)
            end = asyncio.get_running_loop().time() + 30
            while asyncio.get_running_loop().time() < end:
                await pilot.pause(0.1)
                lines = [st.text for st in panel._strips] if panel.display else []
                if len(lines) == want + 3 and all("–" not in ln.split()[-5]
                                                  for ln in lines[1:want + 1]):
                    return lines
            return lines

    s.start()
    try:
        return asyncio.run(go())
    finally:
        s.close()


def test_live_session_with_fake_8_gpu_nvml():
    lines = _live_rows(None, 8)
    assert len(lines) == 11, lines
    by = {ln.split()[1]: ln for ln in lines[1:9]}
    assert by["3"].split()[-5] == "90%"
    assert by["0"].split()[-5] == "10%"
    assert "hi GPU 3" in lines[10]


def test_live_session_samples_only_the_chosen_gpus():
    lines = _live_rows([1, 3], 2)
    assert [ln.split()[:2] for ln in lines[1:3]] == [["GPU", "1"], ["GPU", "3"]]
