"""MkDocs hooks: the reference pages are written from the code each time the site is built.

A page holds a marker such as `<!-- reference: settings -->`; `on_page_markdown` replaces it
with a table made from the code that defines the thing: every pydantic-settings class in the
project's packages (found by reading their sources, so a class added in a new module is found
too), the typer CLI of `python -m producer` (every command, argument and option, with the help
the terminal shows), the reason codes (`contract.names.MEANINGS`), the Redis keys (`contract/keys.py`, `contract/broker/kombu_redis.py`, each
key's comment), the worker's Prometheus metrics (read from
the sources of the modules that declare them) the alert rules (`deploy/prometheus/alerts.yml`) and the stand-in's flags. Nothing is copied by hand, so
the reference cannot drift from the code; a setting without a description, a reason code
without a meaning, a key without a comment or an unknown marker stops the build.
"""
from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the packages documented, also where the project is not installed
    sys.path.insert(0, str(ROOT))
PACKAGES = ("contract", "workers", "producer", "sglang_standin")
MARKER = re.compile(r"<!-- reference: ([a-z-]+) -->")
CLI_NAME = "python -m producer"
METRIC_KINDS = {"Counter": "counter", "Histogram": "histogram", "Gauge": "gauge", "Summary": "summary",
                "GaugeMetricFamily": "gauge", "CounterMetricFamily": "counter",
                "HistogramMetricFamily": "histogram"}


def on_page_markdown(markdown: str, page, config, files, **_) -> str:
    return MARKER.sub(lambda m: generate(m.group(1)), markdown)


def generate(name: str) -> str:
    makers = {"settings": settings_markdown, "cli": cli_markdown, "reasons": reasons_markdown,
              "metrics": metrics_markdown, "alerts": alerts_markdown,
              "standin": standin_markdown, "redis-keys": redis_keys_markdown}
    if name not in makers:
        raise ValueError(f"unknown reference marker {name!r}: one of {', '.join(makers)}")
    return makers[name]()


# --- text -----------------------------------------------------------------------------------

def escape(text: str) -> str:
    """Markdown for plain help text: code spans kept as they are, and outside them the
    characters Markdown or HTML would act on (`<think>` would vanish as a tag, `*` start an
    emphasis, `|` end a table cell) shown as themselves."""
    parts = re.split(r"(`[^`]*`)", text)
    for i in range(0, len(parts), 2):
        parts[i] = (parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
                    .replace("*", r"\*").replace("|", r"\|").replace("[", r"\["))
    return "".join(parts).replace("\n", " ")


def code(text: str) -> str:
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def cell(markdown: str) -> str:
    """Markdown written for the docs (a description with links) made safe for a table cell."""
    return " ".join(markdown.split()).replace("|", r"\|")


def table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell or " " for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _first_paragraph(doc: str | None) -> str:
    return " ".join((doc or "").strip().split("\n\n")[0].split())


# --- settings -------------------------------------------------------------------------------

def settings_classes() -> list[type]:
    """Every pydantic-settings class defined in the project's packages. Only the modules whose
    source declares a class with a base named `...Settings` are imported."""
    from pydantic_settings import BaseSettings

    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            names = [node.name for node in tree.body if isinstance(node, ast.ClassDef)
                     and any(ast.unparse(base).endswith("Settings") for base in node.bases)]
            if not names:
                continue
            module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
            found += [cls for name in names if isinstance(cls := getattr(module, name), type)
                      and issubclass(cls, BaseSettings)]
    return found


def env_name(cls: type, name: str, field) -> str:
    """The variable pydantic-settings reads a field from: its first alias choice, else the
    class's prefix and the field's name (upper case: the lookup ignores case)."""
    from pydantic import AliasChoices

    alias = field.validation_alias or field.alias
    if isinstance(alias, AliasChoices):
        alias = next(choice for choice in alias.choices if isinstance(choice, str))
    if isinstance(alias, str):
        return alias
    return (cls.model_config.get("env_prefix", "") + name).upper()


def own_fields(cls: type) -> dict:
    """The fields a class adds to the settings classes it extends."""
    inherited = {name for base in cls.__mro__[1:] for name in getattr(base, "model_fields", {})
                 if base.__module__.split(".")[0] in PACKAGES}
    return {name: field for name, field in cls.model_fields.items() if name not in inherited}


def setting_rows(cls: type) -> list[tuple[str, object]]:
    """(variable, field) of each field the class adds; a field without a description stops the build."""
    rows = []
    for name, field in own_fields(cls).items():
        if not (field.description or "").strip():
            raise ValueError(f"setting {cls.__module__}.{cls.__name__}.{name} has no description: "
                             "give it Field(..., description=...) for the settings reference")
        rows.append((env_name(cls, name, field), field))
    return rows


def _default(field) -> str:
    if field.default_factory is not None:
        return "computed"
    value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return code(str(value).lower())
    return code(repr(value) if isinstance(value, str) and not value else str(value))


def _kind(field) -> str:
    kind = getattr(field.annotation, "__name__", None) or str(field.annotation)
    kind = {"SecretStr": "secret"}.get(kind, kind.replace("SecretStr", "secret").replace("typing.", "")
                                       .replace("pydantic.types.", ""))
    bounds = []
    for item in field.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if getattr(item, attr, None) is not None:
                bounds.append(f"{sign} {getattr(item, attr)}")
    return escape(kind + (f" ({', '.join(bounds)})" if bounds else ""))


def cli_envvars() -> dict[str, list[str]]:
    """Variables the CLI reads for its options: {variable: ['command --option', ...]}."""
    found: dict[str, list[str]] = {}
    for path, command, _ in cli_commands():
        for param in command.params:
            envvars = param.envvar if isinstance(param.envvar, (list, tuple)) else [param.envvar]
            for var in filter(None, envvars):
                found.setdefault(var, []).append(f"{' '.join(path)} {param.opts[0]}")
    return found


# The reference's three groups, by variable; a variable named in neither list is in "the rest".
MUST_SET = ("REDIS_URL", "SGLANG_URLS", "OUTPUT_DIR", "SGLANG_API_KEY")
USUALLY_TUNED = ("FLEET_RUN", "FLEET_REQUEST_TIMEOUT", "FLEET_MAX_ATTEMPTS", "FLEET_CONTEXT_LENGTH",
                 "FLEET_SHUTDOWN_GRACE", "FLEET_SHARD_MAX_ROWS", "FLEET_SHARD_MAX_WAIT", "FLEET_AFFINITY",
                 "FLEET_METRICS_PORT", "FLEET_METRICS_HOST", "FLEET_TASK_LOG")
SETTING_GROUPS = (("What you must set", "must-set", "Where Redis, the servers and the shards are. "
                   "`SGLANG_API_KEY` only where the servers were started with `--api-key`."),
                  ("What you usually tune", "usually-tuned", "The run's name, the budgets of a request and "
                   "of a prompt, shard sizes, a worker's shutdown and its metrics."),
                  ("The rest", "the-rest", "Defaults sized for SGLang's continuous batching and for fleets "
                   "of thousands of nodes: change them where a page of these docs says why."))


def setting_entries() -> list[dict]:
    """Every variable the processes read: the settings classes' fields (the worker reads all of
    them, the commands the shared ones), the Sentinel master's name, and the CLI's own."""
    from contract.redis_link import connections

    entries = []
    for cls in settings_classes():
        shared = not any(base.__name__.endswith("Settings") and base.__module__.split(".")[0] in PACKAGES
                         for base in cls.__mro__[1:])
        for var, field in setting_rows(cls):
            entries.append({"var": var, "read_by": "worker and commands" if shared else "worker",
                            "kind": _kind(field), "default": _default(field), "meaning": cell(field.description)})
    entries.append({"var": connections.MASTER_ENV, "read_by": "worker and commands", "kind": "str",
                    "default": code(connections.DEFAULT_MASTER),
                    "meaning": escape(_first_paragraph(connections.sentinel_master.__doc__))})
    entries += [{"var": var, "read_by": "commands", "kind": "str", "default": " ",
                 "meaning": "The default of " + ", ".join(f"`{use}`" for use in uses) + "."}
                for var, uses in sorted(cli_envvars().items())]
    named = set(MUST_SET) | set(USUALLY_TUNED)
    unknown = named - {e["var"] for e in entries}
    if unknown:
        raise ValueError(f"the settings reference groups variables no code reads: {', '.join(sorted(unknown))}")
    return entries


def settings_markdown() -> str:
    """Three tables, most needed first; within the first two the order of the lists above."""
    entries = setting_entries()
    rank = {var: i for i, var in enumerate(MUST_SET + USUALLY_TUNED)}
    groups = ([e for e in entries if e["var"] in MUST_SET], [e for e in entries if e["var"] in USUALLY_TUNED],
              [e for e in entries if e["var"] not in rank])
    out = []
    for (title, anchor, intro), members in zip(SETTING_GROUPS, groups):
        members = sorted(members, key=lambda e: rank.get(e["var"], 0))
        out += [f"## {title} {{ #{anchor} }}", "", intro, "",
                table(["variable", "read by", "type", "default", "meaning"],
                      [[code(e["var"]), e["read_by"], e["kind"], e["default"], e["meaning"]] for e in members]), ""]
    return "\n".join(out)


# --- CLI ------------------------------------------------------------------------------------

def cli_commands() -> list[tuple[list[str], object, object]]:
    """(path, command, context) of every command of `python -m producer`, groups included,
    depth first in the order the CLI lists them."""
    import typer.main
    from producer.cli import app

    root = typer.main.get_command(app)
    context_class = root.context_class
    found = []

    def walk(group, parent, path):
        for name, command in group.commands.items():
            if command.hidden:
                continue
            context = context_class(command, info_name=name, parent=parent)
            found.append((path + [name], command, context))
            if getattr(command, "commands", None):
                walk(command, context, path + [name])

    walk(root, context_class(root, info_name=CLI_NAME), [])
    return found


def _help_paragraphs(text: str | None) -> list[str]:
    paragraphs = [" ".join(p.split()) for p in (text or "").replace("\b", "").strip().split("\n\n")]
    return [escape(p) for p in paragraphs if p]


def _params_table(command, context) -> str:
    from producer.cli_help import help_record

    rows = []
    for param in command.params:
        record = help_record(param, context)
        if record is None:
            continue
        decl, help_text = record
        suffix = " (argument)" if param.param_type_name == "argument" else ""
        rows.append([code(decl) + suffix, escape(help_text) or " "])
    rows.append(["`--help`", "Show the command's help and exit."])
    return table(["option", "meaning"], rows)


def cli_markdown() -> str:
    import typer.main
    from producer.cli import app

    root = typer.main.get_command(app)
    context = root.context_class(root, info_name=CLI_NAME)
    out = _help_paragraphs(root.help) + [""]
    own = [p for p in root.params if p.get_help_record(context)]
    if own:
        out += [_params_table(root, context), ""]
    out += [table(["command", "what it does"],
                  [[f"[`{' '.join(path)}`](#{'-'.join(path)})", escape(command.get_short_help_str(limit=120))]
                   for path, command, _ in cli_commands()]), ""]
    for path, command, ctx in cli_commands():
        usage = " ".join([CLI_NAME, *path, *command.collect_usage_pieces(ctx)])
        out += [f"## {' '.join(path)} {{ #{'-'.join(path)} }}", "", "```text", usage, "```", ""]
        out += [p + "\n" for p in _help_paragraphs(command.help)]
        out += [_params_table(command, ctx), ""]
    return "\n".join(out)


# --- reason codes ---------------------------------------------------------------------------

def reasons_markdown() -> str:
    from contract.names import MEANINGS, VERIFY_RULES, Reason

    missing = [r.value for r in Reason if r not in MEANINGS]
    if missing:
        raise ValueError(f"reason codes without a meaning in contract.names.MEANINGS: {', '.join(missing)}")
    rows = [[code(r.value), MEANINGS[r], "yes" if r in VERIFY_RULES else "no",
             f"[troubleshooting](../operate/troubleshooting.md#{r.value})"] for r in Reason]
    return table(["reason", "meaning", "`--disable-rule`", "what to do"], rows)


# --- Redis keys -----------------------------------------------------------------------------

KEY_KIND = re.compile(r"^(hash|string|set|sorted set|counter|list)( per [^:]+)?: ")
# What stands after a key prefix: the name of one of its keys
KEY_PREFIXES = {"WORKER_PREFIX": "<worker>", "AUDIT_PREFIX": "<run>", "SHARERS_PREFIX": "<server URL>",
                "TAKE_PREFIX": "<holder>",
                "state_prefix": "<n>"}


def redis_keys() -> list[dict]:
    """Every key `contract/keys.py` names (module constants that start with `fleet:`, a run's keys
    in `RunKeys`) and kombu's own that `kombu_redis` names, each with its comment, which starts
    with the key's type: the one on its line, or the comment lines right above it."""
    found = []
    for module, owner in (("contract/keys.py", "fleet"), ("contract/broker/kombu_redis.py", "kombu")):
        lines = (ROOT / module).read_text().splitlines()
        for i, line in enumerate(lines):
            named = re.match(r'\s*(?:self\.(\w+)|([A-Z_]+))\s*=\s*(?:f?"([^"]*)"|(base))\s*(?:#\s*(.*))?$', line)
            if not named:
                continue
            name, comment = named.group(1) or named.group(2), named.group(5)
            pattern = (named.group(3) or "{base}").replace("{base}", "fleet:run:<run>")  # `self.spec = base`
            if not (owner == "fleet" and pattern.startswith("fleet:") or comment and KEY_KIND.match(comment)):
                continue
            above = []
            for before in reversed(lines[:i]):
                if not before.strip().startswith("#"):
                    break
                above.insert(0, before.strip().lstrip("#").strip())
            text = comment or " ".join(above)
            kind = KEY_KIND.match(text)
            if kind is None:
                raise ValueError(f"{module}: the key {name} has no comment starting with its type "
                                 f"({KEY_KIND.pattern}): {text!r}")
            found.append({"key": pattern + KEY_PREFIXES.get(name, ""), "kind": kind.group(0)[:-2],
                          "meaning": text[kind.end():], "owner": owner, "name": name, "module": module})
    return found


def redis_keys_markdown() -> str:
    rows = [[code(k["key"]), k["kind"] or " ", escape(k["meaning"]), f"`{k['name']}`"] for k in redis_keys()]
    return table(["key", "type", "what it holds", "named in code"], rows)


# --- metrics --------------------------------------------------------------------------------

def metrics() -> list[dict]:
    """The `fleet_*` metrics declared in the packages' sources: name, kind, labels, help, module."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                        and isinstance(node.args[0].value, str) and node.args[0].value.startswith("fleet_")):
                    continue
                kind = METRIC_KINDS.get(ast.unparse(node.func).split(".")[-1])
                if kind is None:
                    continue
                labels = next((kw.value for kw in node.keywords if kw.arg in ("labels", "labelnames")),
                              node.args[2] if len(node.args) > 2 else None)
                help_text = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else ""
                found.append({"name": node.args[0].value, "kind": kind, "help": help_text,
                              "labels": ast.literal_eval(labels) if labels is not None else [],
                              "module": str(path.relative_to(ROOT))})
    return found


def metrics_markdown() -> str:
    rows = [[code(m["name"]), m["kind"], ", ".join(f"`{label}`" for label in m["labels"]) or " ",
             escape(m["help"]), f"`{m['module']}`"] for m in metrics()]
    return table(["metric", "type", "labels", "meaning", "declared in"], rows)


# --- alerts ---------------------------------------------------------------------------------

def alert_rules() -> list[dict]:
    import yaml

    groups = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def alerts_markdown() -> str:
    out = []
    for rule in alert_rules():
        notes = rule.get("annotations", {})
        out += [f"### {rule['alert']}", "",
                f"**{escape(notes.get('summary', ''))}** Severity `{rule.get('labels', {}).get('severity', '-')}`, "
                f"after the condition has held for `{rule.get('for', '0s')}`.", "",
                escape(notes.get("description", "")), "",
                "```promql", rule["expr"].strip(), "```", ""]
    return "\n".join(out)


# --- the stand-in ---------------------------------------------------------------------------

def standin_markdown() -> str:
    """`python -m sglang_standin --help`, at a fixed width (argparse reads COLUMNS)."""
    import os

    from sglang_standin.cli import build_parser

    width, os.environ["COLUMNS"] = os.environ.get("COLUMNS"), "100"
    try:
        text = build_parser().format_help()
    finally:
        if width is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = width
    return "```text\n" + text.rstrip() + "\n```"
