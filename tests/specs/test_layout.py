"""The worker's parts and the contract's parts import one way: no module imports a part above its own.

`workers/` is laid out by the path a prompt takes through a worker (its package
docstring): `celery.py`, the entry point, over `intake` over `servers` over
`output` over `reporting`, and `settings.py` under them all. `contract/` is
laid out by what each part owns (its package docstring): the `broker` over the
`ledger` over the `fleet`'s reports over the `run`'s spec over `chat`, then
`settings.py` over `storage` over the `redis_link`, and `names.py`, `keys.py` and
`counts.py` under them all. A module imports its own part and the parts below it; an import
that ran back up (a server module reaching into the intake, the ledger into the
broker) would tie the parts into one knot again. And no two files import each
other, however many steps apart, in `contract/`, `workers/` or `bench/`. Imports
are read from the sources (ast), wherever they stand (inside functions too), so
checking them imports nothing.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKERS = ROOT / "workers"
CONTRACT = ROOT / "contract"
BENCH = ROOT / "bench"
# Top to bottom. A part is a sub-package, or one of the few modules at the package's top.
ORDER = ("celery", "intake", "servers", "output", "reporting", "settings")
CONTRACT_ORDER = ("broker", "ledger", "fleet", "run", "chat", "settings", "storage", "redis_link", "names", "keys", "counts")


def packages(tree: Path, order: tuple[str, ...]) -> tuple[str, ...]:
    """The parts of `order` that are sub-packages of `tree` (the others are its modules)."""
    return tuple(part for part in order if (tree / part / "__init__.py").exists() or not (tree / f"{part}.py").exists())


def part_of(module: str, top: str = "workers") -> str | None:
    """`workers.intake.tasks` -> "intake", `workers.celery` -> "celery"; None for the package itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == top else None


def module_of(path: Path, tree: Path) -> str:
    parts = (tree.name,) + path.relative_to(tree).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(node: ast.AST, module: str, is_package: bool, top: str = "workers",
             parts: tuple[str, ...] = ORDER[1:-1]) -> list[str]:
    """The modules of `top` one import statement names (relative imports resolved)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.split(".")[0] == top]
    if not isinstance(node, ast.ImportFrom):
        return []
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]).strip(".") \
        if node.level else (node.module or "")
    if base.split(".")[0] != top:
        return []
    if base == top or (base.count(".") == 1 and part_of(base, top) in parts):
        return [f"{base}.{alias.name}" for alias in node.names]  # from a package: its modules
    return [base]


def import_nodes(path: Path) -> list[ast.AST]:
    return sorted((n for n in ast.walk(ast.parse(path.read_text(), str(path)))
                   if isinstance(n, (ast.Import, ast.ImportFrom))), key=lambda n: n.lineno)


def upward_imports(tree: Path, order: tuple[str, ...] = ORDER) -> list[str]:
    """Each import of a module in a part above the importer's own, as `file:line: what`."""
    top, found = tree.name, []
    parts = packages(tree, order)
    for path in sorted(tree.rglob("*.py")):
        module = module_of(path, tree)
        own = part_of(module, top)
        for node in import_nodes(path):
            for target in imported(node, module, path.name == "__init__.py", top, parts):
                theirs = part_of(target, top)
                if theirs not in order:
                    found.append(f"{path.relative_to(tree.parent)}:{node.lineno}: imports {target}, "
                                 f"which is in no part")
                elif own is None or own not in order or order.index(theirs) < order.index(own):
                    found.append(f"{path.relative_to(tree.parent)}:{node.lineno}: imports {target} "
                                 f"({theirs} is above {own or f'the {top} package'})")
    return found


def outside_parts(tree: Path, order: tuple[str, ...] = ORDER) -> list[str]:
    """Modules of the package that stand in no part."""
    allowed = {f"{name}.py" for name in order} | {"__init__.py"} | set(order)
    return [f"{tree.name}/{p.name} is in no part (one of {', '.join(order)})" for p in sorted(tree.iterdir())
            if p.name not in allowed and p.name != "__pycache__" and (p.suffix == ".py" or p.is_dir())]


def file_imports(tree: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (each a file: a package is its `__init__.py`)."""
    top = tree.name
    paths = {module_of(path, tree): path for path in sorted(tree.rglob("*.py"))}
    graph = {}
    for module, path in paths.items():
        is_package = path.name == "__init__.py"
        targets = set()
        for node in import_nodes(path):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names if alias.name.split(".")[0] == top}
                continue
            package = module.split(".") if is_package else module.split(".")[:-1]
            base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]).strip(".") \
                if node.level else (node.module or "")
            if base.split(".")[0] == top:
                targets |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base
                            for alias in node.names}
        graph[module] = {t for t in targets if t in paths and t != module}
    return graph


def circles(tree: Path) -> list[list[str]]:
    """Each set of the package's files that import one another, however many steps apart (sorted names)."""
    graph = file_imports(tree)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def test_no_module_imports_a_part_above_its_own():
    # Given the worker's modules, then each imports only its own part and the parts below it
    assert upward_imports(WORKERS) == []


def test_every_module_of_the_workers_is_in_a_part():
    # Given workers/, then each module is the entry point, the settings, or in one of the parts
    assert outside_parts(WORKERS) == []


def test_no_contract_module_imports_a_part_above_its_own():
    # Given the contract's modules, then each imports only its own part and the parts below it
    assert upward_imports(CONTRACT, CONTRACT_ORDER) == []


def test_every_module_of_the_contract_is_in_a_part():
    # Given contract/, then each module is one of the few at its top or in one of the parts
    assert outside_parts(CONTRACT, CONTRACT_ORDER) == []


def test_each_part_says_what_it_owns_and_what_it_may_import():
    # Given each part that is a package, then its docstring says what it owns and what it may import
    for tree, order in ((WORKERS, ORDER), (CONTRACT, CONTRACT_ORDER)):
        for part in packages(tree, order):
            doc = ast.get_docstring(ast.parse((tree / part / "__init__.py").read_text())) or ""
            assert doc and "import" in doc.lower(), f"{tree.name}/{part}/__init__.py does not say what it may import"


def test_no_two_files_import_each_other():
    # Given the contract, the worker and the benchmarks, then no file's imports lead back to it
    for tree in (CONTRACT, WORKERS, BENCH):
        assert circles(tree) == [], tree.name


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
    # and the two files that import each other (one inside a function) are a circle
    assert circles(tree) == [["workers.intake.tasks", "workers.reporting.metrics"]]


def test_a_circle_of_three_files_and_a_package_is_found(tmp_path):
    # Given a package whose __init__ imports a module that imports a sibling that imports the package
    tree = tmp_path / "contract"
    (tree / "storage").mkdir(parents=True)
    (tree / "__init__.py").write_text("")
    (tree / "storage" / "__init__.py").write_text("def store():\n    from .s3 import S3\n")
    (tree / "storage" / "s3.py").write_text("from contract.storage.schema import is_shard\n")
    (tree / "storage" / "schema.py").write_text("from . import store\nfrom contract import keys\n")
    (tree / "keys.py").write_text("")
    # then the three files are one circle, and keys in none
    assert circles(tree) == [["contract.storage", "contract.storage.s3", "contract.storage.schema"]]
