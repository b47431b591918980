"""How a command's help names its arguments: `DEST`, as the help text says it, not typer's
`{DEST}` in the usage line nor `DEST <str>` in the list of arguments.

typer 0.2x wraps a required argument in braces and adds its Python type; a user reads
`export [OPTIONS] DEST` and `DEST  A new or empty folder...`, as the commands' own text and
the docs write them. Every command of `python -m producer` is made with `Command`; the
CLI reference (scripts/mkdocs_hooks.py) reads the same usage pieces and records.
"""
from __future__ import annotations

import click
from typer.core import TyperCommand


def usage_name(param: click.Parameter) -> str:
    """An argument as a usage line writes it: NAME, [NAME] when optional, NAME... when repeated."""
    name = param.metavar or param.name.upper()
    name = name if param.required else f"[{name}]"
    return name + ("..." if param.nargs != 1 else "")


def help_record(param: click.Parameter, ctx: click.Context) -> tuple[str, str] | None:
    """The (name, help) line of a parameter in the command's help: an argument by its name alone."""
    record = param.get_help_record(ctx)
    if record is None or param.param_type_name != "argument":
        return record
    return usage_name(param), record[1]


class Command(TyperCommand):
    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            pieces += [usage_name(param)] if param.param_type_name == "argument" else param.get_usage_pieces(ctx)
        return pieces

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        records = {"argument": [], "option": []}
        for param in self.get_params(ctx):
            record = help_record(param, ctx)
            if record is not None and param.param_type_name in records:
                records[param.param_type_name].append(record)
        for kind, title in (("argument", "Arguments"), ("option", "Options")):
            if records[kind]:
                with formatter.section(title):
                    formatter.write_dl(records[kind])
