"""The documentation site: it builds, every page is reachable, and the references are the code's.

The site (mkdocs.yml, docs/) is built with `mkdocs build --strict`, so a broken link, a broken
anchor or a page outside the navigation fails. The settings, CLI, reason-code and metrics pages
are generated from the code at build time (scripts/mkdocs_hooks.py); these specs read the built
pages and check them against the code independently of the generator: each documented variable
is read by its settings class into a field, and every field, command, option, reason code and
metric is on its page. README.md stays a short entrance whose links all lead somewhere.
"""
from __future__ import annotations

import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def nav_pages(entries) -> list[str]:
    pages = []
    for entry in entries:
        for value in (entry.values() if isinstance(entry, dict) else [entry]):
            pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def mkdocs_config() -> dict:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


# --- fast: the files themselves ---------------------------------------------------------------

def test_every_page_under_docs_is_in_the_navigation_and_every_entry_exists():
    # Given the navigation of mkdocs.yml and the pages under docs/
    nav = nav_pages(mkdocs_config()["nav"])
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    # then each page is reachable from the navigation, once, and each entry is a page
    assert sorted(set(nav)) == pages
    assert len(nav) == len(set(nav))


LAB_NOTES = {
    "a test file": re.compile(r"\btests/|\btest_\w+\.py"),
    "a commit hash": re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"),
    "a load average": re.compile(r"load average", re.I),
    "a measurement's date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    "the code before a change": re.compile(r"\bthe stand-in before\b|\bbefore this change\b|\bwhat was cut\b", re.I),
}


def test_users_pages_say_what_a_user_sees_and_leave_history_and_tests_to_development():
    # Given every page outside docs/development/
    pages = [p for p in DOCS.rglob("*.md") if "development" not in p.relative_to(DOCS).parts]
    found = []
    for path in pages:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            found += [f"{path.relative_to(ROOT)}:{n}: {what}" for what, pattern in LAB_NOTES.items()
                      if pattern.search(line)]
    # then none names a test file, a commit, a machine's load, a date of measurement or the code of before
    assert found == []


def test_troubleshooting_says_what_to_do_about_every_reason_code_and_every_wait():
    from contract.names import Reason

    # Given the troubleshooting page, linked from the home page and the reason-code reference
    text = (DOCS / "operate" / "troubleshooting.md").read_text()
    assert "operate/troubleshooting.md" in (DOCS / "index.md").read_text()
    assert "../operate/troubleshooting.md" in (DOCS / "reference" / "reason-codes.md").read_text()
    # then each reason code has its own section (the reference's table links to it by the code)
    sections = re.findall(r"^### `(\w+)` \{#(\w+)\}$", text, re.M)
    assert sorted(code for code, anchor in sections if code == anchor) == sorted(r.value for r in Reason)
    # and so do the waits a newcomer meets, the demo's planted dead letters among them
    for heading in ("A worker that waits forever", "No healthy server", "A refused server", "Redis warnings",
                    "A run that stalls"):
        assert f"\n## {heading}\n" in text, heading
    assert "11 `missing_think_end`" in text and "--fault-missing-think-end" in text


def test_the_readme_is_short_and_its_links_lead_to_pages_that_exist():
    readme = (ROOT / "README.md").read_text()
    # Given the README, then a newcomer reads it in a few minutes
    assert len(readme.splitlines()) < 150
    # and install and the two commands come first, before anything else
    assert readme.index("## Install") < readme.index("scripts/demo.sh") < readme.index("## Running it for real")
    assert "scripts/test.sh" in readme[:readme.index("## Running it for real")]
    # and every relative link (and image) names a file of the repository that exists
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if "://" not in link]
    assert local, "the README links into the documentation"
    assert [link for link in local if not (ROOT / link).exists()] == []
    # and each page it links under docs/ is one the site builds
    nav = set(nav_pages(mkdocs_config()["nav"]))
    assert [link for link in local if link.startswith("docs/") and link.endswith(".md")
            and link.removeprefix("docs/") not in nav] == []


def test_the_readme_and_the_walkthrough_start_the_worker_alike():
    # Given the README's short version and the documentation's walk-through of one node
    def worker_line(path: Path) -> str:
        [line] = [l.strip() for l in path.read_text().splitlines() if l.strip().startswith("celery -A workers")]
        return line

    # then they start the worker with the same command line
    assert worker_line(ROOT / "README.md") == worker_line(DOCS / "deploy" / "one-node.md")


# --- slow: the built site ---------------------------------------------------------------------

class Page(HTMLParser):
    """The parts of a built page these specs read: headings (id, text) and table rows (the text
    of each cell), each row tagged with the heading above it."""

    def __init__(self, text: str):
        super().__init__()
        self.headings: list[tuple[str, str]] = []
        self.rows: list[tuple[str, list[str]]] = []
        self._heading: list | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        if re.fullmatch(r"h[1-6]", tag):
            self._heading = [dict(attrs).get("id", ""), ""]
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if re.fullmatch(r"h[1-6]", tag) and self._heading:
            self.headings.append((self._heading[0], self._heading[1].replace("¶", "").strip()))
            self._heading = None
        elif tag in ("td", "th") and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows.append((self.headings[-1][0] if self.headings else "", self._row))
            self._row = None

    def handle_data(self, data):
        if self._heading is not None:
            self._heading[1] += data
        if self._cell is not None:
            self._cell.append(data)

    def text(self) -> str:
        return " ".join(cell for _, row in self.rows for cell in row) + " " + \
            " ".join(text for _, text in self.headings)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    # When the site is built strictly (a warning, such as a broken link or anchor, fails it)
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin", "HOME": str(out)})
    # then it builds
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def page(site: Path, name: str) -> Page:
    return Page((site / name).read_text())


@pytest.mark.slow
def test_every_page_of_the_navigation_is_built(site):
    for name in nav_pages(mkdocs_config()["nav"]):
        assert (site / name.replace(".md", ".html")).is_file(), name
    # and the README's figure is on the report page
    assert (site / "report.png").is_file()
    assert 'src="../report.png"' in (site / "operate" / "report.html").read_text()


def _value_for(name: str, field, default) -> tuple[str, object]:
    """A value other than the default that the field accepts: (as the environment spells it, as read)."""
    if name == "sglang_api_key":
        return "docs-check-key", "docs-check-key"
    kind = field.annotation
    if kind is bool:
        return str(not default).lower(), not default
    if kind in (int, float):
        return str(default + 7), default + 7
    return "s3://docs-check/prefix", "s3://docs-check/prefix"


def _fields_read_from(cls, own: set[str], var: str, monkeypatch) -> set[str]:
    """The fields of `own` that take their value from the variable `var`."""
    base = cls()
    changed = set()
    for name in own:
        text, value = _value_for(name, cls.model_fields[name], getattr(base, name))
        monkeypatch.setenv(var, text)
        try:
            read = getattr(cls(), name)
        except ValueError:  # a value of this field's type refused by the variable's own field
            read = None
        finally:
            monkeypatch.delenv(var)
        read = read.get_secret_value() if hasattr(read, "get_secret_value") else read
        if read == value:
            changed.add(name)
    return changed


@pytest.mark.slow
def test_the_settings_reference_names_the_variable_each_field_is_read_from(site, monkeypatch):
    from contract.settings import SharedSettings
    from workers.settings import Settings

    reference = page(site, "reference/settings.html")
    # Given the reference, then it is grouped: what you must set, what you usually tune, the rest
    assert [text for _, text in reference.headings][1:4] == ["What you must set", "What you usually tune",
                                                            "The rest"]
    documented: dict[str, list] = {}  # variable -> (group heading, its row)
    for heading, cells in reference.rows:
        if cells and re.fullmatch(r"[A-Z][A-Z0-9_]+", cells[0]):
            documented.setdefault(cells[0], []).append((heading, cells))
    # and each variable is listed once, the three a worker cannot run without among what you must set
    assert all(len(rows) == 1 for rows in documented.values()), documented
    assert {var for var, [(heading, _)] in documented.items() if heading == "must-set"} >= {
        "REDIS_URL", "SGLANG_URLS", "OUTPUT_DIR"}
    for var in documented:
        monkeypatch.delenv(var, raising=False)
    # and each variable a settings class reads is read into exactly one of its fields, by whom the row says
    for cls, reader in ((SharedSettings, "worker and commands"), (Settings, "worker")):
        inherited = {n for base in cls.__mro__[1:] for n in getattr(base, "model_fields", {})}
        own = {n for n in cls.model_fields if n not in inherited}
        found = set()
        for var in [v for v, [(_, cells)] in documented.items() if cells[1] == reader]:
            changed = _fields_read_from(cls, own, var, monkeypatch)
            assert len(changed) <= 1, (var, changed)
            found |= changed
        # and every field the class adds is listed
        assert found == own, own - found
    # and so are the variables read outside the classes
    assert {"FLEET_SENTINEL_MASTER", "FLEET_RUN"} <= set(documented)


def _cli_commands():
    """(path, command) of every command of `python -m producer`, read from the typer app."""
    import typer.main

    from producer.cli import app

    found = []

    def walk(group, path):
        for name, command in group.commands.items():
            found.append((path + [name], command))
            walk(command, path + [name]) if getattr(command, "commands", None) else None

    walk(typer.main.get_command(app), [])
    return found


@pytest.mark.slow
def test_the_cli_reference_lists_every_command_and_option_with_its_help(site):
    reference = page(site, "reference/cli.html")
    ids = {a for a, _ in reference.headings}
    helps = [row[1] for _, row in reference.rows if len(row) == 2]
    text = reference.text()
    for path, command in _cli_commands():
        # Given a command of the CLI, then it has its section
        assert "-".join(path) in ids, path
        for param in command.params:
            # and each of its options (and arguments) is listed, under every name it answers to
            # (an argument by the placeholder its usage shows)
            names = [param.metavar or param.name.upper()] if param.param_type_name == "argument" \
                else [*param.opts, *param.secondary_opts]
            for name in names:
                assert name in text, (path, name)
            # with its help
            if getattr(param, "help", None):
                assert any(" ".join(param.help.split())[:40] in help_text for help_text in helps), \
                    (path, param.name)


@pytest.mark.slow
def test_the_reason_and_metric_references_list_every_code_and_metric(site):
    from contract.names import Reason
    from prometheus_client import REGISTRY

    import workers.reporting.metrics  # noqa: F401 - declares the counters and histograms

    reasons = {row[0] for _, row in page(site, "reference/reason-codes.html").rows}
    # Given the reason codes, then each is on the reference page
    assert {r.value for r in Reason} <= reasons
    metrics = {row[0] for _, row in page(site, "reference/metrics.html").rows}
    # and each fleet_* metric a worker registers at import is on the metrics page
    registered = {m.name for m in REGISTRY.collect() if m.name.startswith("fleet_")}
    assert registered
    assert {name if name in metrics else name + "_total" for name in registered} <= metrics
    # and so are the gauges read at scrape time
    gauges = set(re.findall(r'GaugeMetricFamily\("(fleet_\w+)"', (ROOT / "workers" / "reporting" / "metrics.py").read_text()))
    assert gauges and gauges <= metrics


@pytest.mark.slow
def test_the_redis_keys_reference_lists_every_key_the_fleet_names(site):
    import contract.keys as keys

    listed = {row[0] for _, row in page(site, "reference/redis-keys.html").rows}
    # Given every key name contract/keys.py defines, then each one's pattern is on the page
    run_keys = {value for name, value in vars(keys.RunKeys("<run>")).items()}
    constants = {value for name, value in vars(keys).items() if isinstance(value, str) and value.startswith("fleet:")}
    assert run_keys and constants
    for key in run_keys | constants:
        assert any(row.startswith(key) for row in listed), key
    # and kombu's unacknowledged hash and its lease index, which the fleet reads and writes
    assert {"unacked", "unacked_index"} <= listed


def test_the_docs_build_command_installs_the_docs_extra_alone():
    # Given the README's and the site page's commands for the documentation
    for path in (ROOT / "README.md", DOCS / "development" / "docs.md"):
        text = path.read_text()
        installs = re.findall(r'pip install[^\n`]*-e "?\.(\[[^\]]*\])', text[max(0, text.index("mkdocs serve") - 300):text.index("mkdocs serve")])
        # then the install before `mkdocs serve` is the docs extra, not the suite's (scripts/setup.sh: SGLang, 6 GB)
        assert installs and installs[0] == "[docs]", (path, installs)
        assert "scripts/setup.sh && " not in text, path
