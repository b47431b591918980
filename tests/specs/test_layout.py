"""The worker's parts import one way: no module imports a part above its own.

`workers/` is laid out by the path a prompt takes through a worker (its package
docstring): `celery.py`, the entry point, over `intake` over `servers` over
`output` over `reporting`, and `settings.py` under them all. A module imports
its own part and the parts below it; an import that ran back up (a server module
reaching into the intake, the shard writer into the servers) would tie the parts
into one knot again. Imports are read from the sources (ast), wherever they stand
(inside functions too), so checking them imports nothing.
"""
from __future__ import annotations

import ast
from pathlib import Path

WORKERS = Path(__file__).resolve().parents[2] / "workers"
# Top to bottom. A part is a sub-package of workers/; celery and settings are its two modules.
ORDER = ("celery", "intake", "servers", "output", "reporting", "settings")
PACKAGES = ORDER[1:-1]


def part_of(module: str) -> str | None:
    """`workers.intake.tasks` -> "intake", `workers.celery` -> "celery"; None for the package itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "workers" else None


def module_of(path: Path, workers: Path) -> str:
    parts = ("workers",) + path.relative_to(workers).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The workers modules one import statement names (relative imports resolved)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.split(".")[0] == "workers"]
    if not isinstance(node, ast.ImportFrom):
        return []
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]).strip(".") \
        if node.level else (node.module or "")
    if base.split(".")[0] != "workers":
        return []
    if base == "workers" or (base.count(".") == 1 and part_of(base) in PACKAGES):
        return [f"{base}.{alias.name}" for alias in node.names]  # from a package: its modules
    return [base]


def upward_imports(workers: Path) -> list[str]:
    """Each import of a module in a part above the importer's own, as `file:line: what`."""
    found = []
    for path in sorted(workers.rglob("*.py")):
        module = module_of(path, workers)
        own = part_of(module)
        nodes = sorted((n for n in ast.walk(ast.parse(path.read_text(), str(path)))
                        if isinstance(n, (ast.Import, ast.ImportFrom))), key=lambda n: n.lineno)
        for node in nodes:
            for target in imported(node, module, path.name == "__init__.py"):
                theirs = part_of(target)
                if theirs not in ORDER:
                    found.append(f"{path.relative_to(workers.parent)}:{node.lineno}: imports {target}, "
                                 f"which is in no part")
                elif own is None or own not in ORDER or ORDER.index(theirs) < ORDER.index(own):
                    found.append(f"{path.relative_to(workers.parent)}:{node.lineno}: imports {target} "
                                 f"({theirs} is above {own or 'the workers package'})")
    return found


def outside_parts(workers: Path) -> list[str]:
    """Modules of workers/ that stand in no part."""
    allowed = {f"{name}.py" for name in ORDER} | {"__init__.py"} | set(ORDER)
    return [f"workers/{p.name} is in no part (one of {', '.join(ORDER)})" for p in sorted(workers.iterdir())
            if p.name not in allowed and p.name != "__pycache__" and (p.suffix == ".py" or p.is_dir())]


def test_no_module_imports_a_part_above_its_own():
    # Given the worker's modules, then each imports only its own part and the parts below it
    assert upward_imports(WORKERS) == []


def test_every_module_of_the_workers_is_in_a_part():
    # Given workers/, then each module is the entry point, the settings, or in one of the parts
    assert outside_parts(WORKERS) == []


def test_an_import_that_runs_back_up_is_found(tmp_path):
    # Given a tree where reporting imports the intake (at the top of a module and inside a
    # function) and the intake imports reporting (allowed: downwards)
    tree = tmp_path / "workers"
    for part in ("intake", "reporting"):
        (tree / part).mkdir(parents=True)
        (tree / part / "__init__.py").write_text("")
    (tree / "__init__.py").write_text("")
    (tree / "stray.py").write_text("")
    (tree / "intake" / "tasks.py").write_text("from ..reporting import metrics\nfrom workers.settings import S\n")
    (tree / "reporting" / "metrics.py").write_text(
        "from ..intake.tasks import committing\n\ndef later():\n    from workers import celery\n")
    # then both upward imports are named, with their lines, and nothing else
    assert upward_imports(tree) == [
        "workers/reporting/metrics.py:1: imports workers.intake.tasks (intake is above reporting)",
        "workers/reporting/metrics.py:4: imports workers.celery (celery is above reporting)",
    ]
    # and a module outside the parts is named
    assert outside_parts(tree) == ["workers/stray.py is in no part (one of " + ", ".join(ORDER) + ")"]
