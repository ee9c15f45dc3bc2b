"""The `gpuchef` command line (click). Each command imports its heavy modules lazily so that
`gpuchef --help` is instant."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="gpuchef")
def cli() -> None:
    """gpuchef: watch and steer continuous batching vs chunked prefill on a live LLM engine."""


def _register() -> None:
    from .bench import bench
    cli.add_command(bench)
    from .top import top
    cli.add_command(top)
    from .ab import ab
    cli.add_command(ab)
    from .report import report
    cli.add_command(report)
    from .replay import replay
    cli.add_command(replay)
    from .serve import serve
    cli.add_command(serve)
    from .bench_attention import bench_attention
    cli.add_command(bench_attention)


def main() -> None:
    _register()
    cli()
