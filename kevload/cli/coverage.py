"""`kevload coverage`: live inputs against the training set."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("coverage")
@click.argument("online", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("train", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--json",
    "json_out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the report here.",
)
@click.option(
    "--flag",
    "flag_out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write each online input with its boundary-sample reasons (JSONL).",
)
@click.option(
    "--max-bad",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="Bad lines (not JSON, torn, no input) skipped per file before the file is refused "
    "(exit 2).",
)
def coverage_command(
    online: Path, train: Path, json_out: Path | None, flag_out: Path | None, max_bad: int
) -> None:
    """Compare live inputs (ONLINE.jsonl) with the training set (TRAIN.jsonl): lengths, keywords,
    labels."""
    import orjson

    from kevload.guide.coverage import compare, coverage_text, flag_file, scan, segmenter

    seg = segmenter()
    online_side = scan(online, max_bad=max_bad, seg=seg)
    train_side = scan(train, max_bad=max_bad, seg=seg)
    result = compare(online_side, train_side)
    if flag_out is not None:
        result["flagged"] = flag_file(online, train_side, flag_out, max_bad=max_bad)
    click.echo(coverage_text(result))
    if json_out is not None:
        json_out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
