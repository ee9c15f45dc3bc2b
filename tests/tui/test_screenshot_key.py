"""`s` saves an SVG of the screen; when the folder has gone (or cannot be written) it says so and
the dashboard keeps running instead of crashing (a new user's --screenshot-dir crashed `top`)."""

import asyncio

from tui_fakes import StaticSession, settle

from gpuchef.tui.app import GpuchefApp


class NotingApp(GpuchefApp):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.notes: list[str] = []

    def notify(self, message, *a, **kw):
        self.notes.append(str(message))
        super().notify(message, *a, **kw)


def test_s_saves_an_svg_and_a_missing_folder_is_a_message(tmp_path):
    shots = tmp_path / "shots"
    shots.mkdir()
    app = NotingApp(StaticSession(gpu=True), screenshot_dir=str(shots), show_ui_cost=False)

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            await pilot.press("s")
            await pilot.pause(0.3)
            saved = list(shots.glob("*.svg"))
            assert len(saved) == 1 and saved[0].read_text().lstrip().startswith("<svg")
            saved[0].unlink()
            shots.rmdir()  # the folder goes away mid-session
            await pilot.press("s")
            await pilot.pause(0.3)
            assert any(n.startswith("screenshot not saved") and str(shots) in n
                       for n in app.notes), app.notes
            assert app.is_running
            await pilot.press("question_mark")  # still responds to keys
            await pilot.pause(0.2)
            assert type(app.screen).__name__ == "HelpScreen"

    asyncio.run(go())
