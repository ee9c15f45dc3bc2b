"""--help's conditions name flags the command has: an option whose help starts "With --X"
(the flag that turns it on) must be one that `gpuchef CMD` accepts. `top --help` said "With
--base-url or --attach" (top has no --base-url) and `bench --help` / `ab --help` the same
(neither has --attach)."""

import re

import pytest
from click.testing import CliRunner

from gpuchef.cli import _register, cli

_register()

#: "With --attach:", "With --base-url (ab: or --a/--b url=URL):", "With --base-url or --attach,"
_CONDITION = re.compile(r"^With ((?:--[a-z][a-z0-9-]*(?:\s*\(.*?\))?(?: or )?)+)")


def _flags(cmd) -> set[str]:
    return {o for p in cmd.params
            for o in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ()))}


@pytest.mark.parametrize("name", sorted(cli.commands))
def test_with_flag_conditions_name_flags_of_the_command(name):
    cmd = cli.commands[name]
    flags = _flags(cmd)
    checked = 0
    for p in cmd.params:
        m = _CONDITION.match(getattr(p, "help", None) or "")
        if not m:
            continue
        named = re.findall(r"--[a-z][a-z0-9-]*", re.sub(r"\(.*?\)", "", m.group(1)))
        checked += 1
        missing = [f for f in named if f not in flags]
        assert not missing, (f"gpuchef {name} {p.opts[0]}: its help names {missing}, "
                             f"not a flag of {name}")
    if name in ("bench", "ab", "top"):
        assert checked >= 5  # the HTTP client's flags are there and were checked


@pytest.mark.parametrize("name,via", [("top", "--attach"), ("bench", "--base-url")])
def test_help_text_as_printed(name, via):
    out = CliRunner().invoke(cli, [name, "--help"], terminal_width=100).output
    assert re.search(rf"--max-concurrency INTEGER\s+With {via}", out), out
