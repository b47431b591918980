"""Figures: each number with its goal, printed as one table and saved as JSON.

A figure is judged only against a ratio or a size measured in the same run,
never against an absolute time: the machines this runs on are shared and
noisy, and only ratios survive that.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table


@dataclass
class Figure:
    part: str
    name: str
    value: float | None
    fmt: str = "{:,.2f}"
    unit: str = ""
    goal: str = ""
    met: bool | None = None   # None: informational, no goal
    note: str = ""

    def shown(self) -> str:
        if self.value is None:
            return "n/a"
        return self.fmt.format(self.value) + (f" {self.unit}" if self.unit else "")


def at_least(value: float | None, goal: float) -> bool | None:
    return None if value is None else value >= goal


def at_most(value: float | None, goal: float) -> bool | None:
    return None if value is None else value <= goal


def print_table(figures: list[Figure], console: Console, title: str) -> None:
    table = Table(title=title, show_lines=False)
    for column, justify in (("part", "left"), ("figure", "left"), ("value", "right"),
                            ("goal", "left"), ("", "left"), ("note", "left")):
        table.add_column(column, justify=justify, overflow="fold")
    last = None
    for f in figures:
        mark = {True: "[green]met[/green]", False: "[red]NOT met[/red]", None: ""}[f.met]
        table.add_row(f.part if f.part != last else "", f.name, f.shown(), f.goal, mark, f.note)
        last = f.part
    console.print(table)


def write_json(path: Path, figures: list[Figure], details: dict, meta: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = {"meta": meta, "figures": [asdict(f) for f in figures], "details": details}
    path.write_text(json.dumps(blob, indent=2, default=str) + "\n")
