"""The dataset card: `README.md` beside an export, saying what made its samples.

A dataset of reasoning traces is only as useful as what is known of its
making: which checkpoint answered (the servers' model paths, their SGLang
versions and, above all, every `weight_version` that answered, since weights
pushed mid-run make two datasets in one), how the prompts were tokenized (the
tokenizer and chat-template fingerprints a trainer must match), how they were
sampled (the parameters, samples per prompt and the seed rule, so a re-run asks
the same seeds), which verifier judged them, and what was lost (dead letters
by reason) or judged (verdict counts). `export` writes it from what the run
already keeps, none of it growing with the run's size: the spec, the ledger's
counters (states, `reason:<code>`, `verdict:<label>` where the run's verifier
counts them), the run's provenance hash (`contract/fleet/provenance.py`) and the
manifest's counts. The card is Hugging Face style: YAML front matter (the
data files, tags, and the same facts as machine-readable `reasoning_fleet`
keys), then prose and tables.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone

from contract.fleet.provenance import Origin
from contract.run.spec import RunSpec

from contract.counts import counted

from .export_folder import CARD  # noqa: F401  (the card's file name, re-exported)

SEED_RULE = ("each sample's `sampling_seed` is derived from the run's name, the prompt's id and the "
             "sample's index (sha256 of `run\\0id\\0index`, first 8 bytes, mod 2^31), or, where a line gives "
             "its own `sampling.seed` S, S + index (mod 2^31): a re-run asks the same seeds "
             "(`contract/run/samples.py`)")


def verdicts(counters: dict[str, int]) -> dict[str, int]:
    """The run's verdict counts (`verdict:<label>` in its counters), where its verifier keeps them."""
    return {k.split(":", 1)[1]: int(v) for k, v in sorted(counters.items()) if k.startswith("verdict:")}


def card_facts(spec: RunSpec, manifest: dict, origins: list[Origin], counters: dict[str, int]) -> dict:
    """What the card says, as plain data (also its front matter's `reasoning_fleet` entry)."""
    enqueued = int(counters.get("enqueued", 0))
    return {
        "run": spec.name,
        "exported_at": manifest.get("exported_at"),
        "model_paths": sorted({o.model_path for o in origins if o.model_path}) or manifest.get("models") or [],
        "served_model": spec.served_model,
        "servers": [{"server": o.server, "sglang_version": o.sglang_version, "weight_version": o.weight_version,
                     "model_path": o.model_path, "served_model_name": o.served_model_name,
                     "first_seen": o.first_seen} for o in origins],
        "sglang_versions": sorted({o.sglang_version for o in origins if o.sglang_version}),
        "weight_versions": sorted({o.weight_version for o in origins}),
        "tokenizer": spec.tokenizer,
        "tokenizer_fingerprint": spec.tokenizer_fingerprint,
        "template_fingerprint": spec.template_fingerprint,
        "thinking": spec.thinking,
        "think_start_id": spec.think_start_id,
        "think_end_id": spec.think_end_id,
        "stop_ids": list(spec.stop_ids),
        "turns": spec.turns,
        "sampling": dict(spec.sampling),
        "samples_per_prompt": spec.samples,
        "until_verified": spec.until_verified,
        "seed_rule": SEED_RULE,
        "logprobs": spec.logprobs,
        "verifier": spec.verify,
        "disabled_rules": list(spec.disabled_rules),
        "counts": {
            "prompts": manifest.get("prompts", enqueued),  # counted at enqueue (the run's `prompts` counter)
            "samples_enqueued": enqueued,
            "samples_done": int(counters.get("state:done", 0)),
            "samples_dead": int(counters.get("state:dead", 0)),
            "samples_queued": int(counters.get("state:queued", 0)),
            "rows_exported": manifest.get("rows", 0),
            "prompt_tokens": int(counters.get("prompt_tokens", 0)),
            "output_tokens": int(counters.get("output_tokens", 0)),
        },
        "dead_letters": {k[7:]: int(v) for k, v in sorted(counters.items()) if k.startswith("reason:") and int(v) > 0},
        "verdicts": verdicts(counters),
    }


def render_card(spec: RunSpec, manifest: dict, origins: list[Origin], counters: dict[str, int]) -> str:
    """The card's Markdown, front matter first."""
    facts = card_facts(spec, manifest, origins, counters)
    files = [f["name"] for f in manifest.get("files", []) if str(f.get("name", "")).endswith(".parquet")
             and not str(f["name"]).startswith("keep-")]
    front = {"pretty_name": f"reasoning traces: {spec.name}",
             "tags": ["reasoning", "synthetic", "sglang", "reasoning-fleet"]}
    if files:
        front["configs"] = [{"config_name": "default", "data_files": [{"split": "train", "path": files}]}]
    front["reasoning_fleet"] = facts
    counts = facts["counts"]
    lines = ["---", _yaml(front).rstrip(), "---", "",
             f"# {spec.name}", "",
             f"Reasoning traces generated by reasoning-fleet from SGLang's native "
             f"`/generate`: each row's `input_ids` is the prompt's token ids (the chat template's rendering) "
             f"then the server's `output_ids`, exactly; `prompt_len` says where one ends. Exported "
             f"{_when(facts['exported_at'])}.", "",
             "## Counts", "",
             "| | |", "|---|---|",
             f"| prompts | {counts['prompts']:,} |",
             f"| samples per prompt | {facts['samples_per_prompt']} |",
             f"| samples enqueued | {counts['samples_enqueued']:,} |",
             f"| samples done | {counts['samples_done']:,} |",
             f"| samples dead-lettered | {counts['samples_dead']:,} |",
             f"| samples still queued | {counts['samples_queued']:,} |",
             f"| rows exported | {counts['rows_exported']:,} |",
             f"| prompt tokens | {counts['prompt_tokens']:,} |",
             f"| output tokens | {counts['output_tokens']:,} |", "",
             "## Model and servers", ""]
    lines.append(f"Model path(s): {', '.join(f'`{m}`' for m in facts['model_paths']) or 'not recorded'}"
                 + (f"; the run named `{spec.served_model}`." if spec.served_model else "."))
    lines.append("")
    if origins:
        lines += [f"Weight versions: {', '.join(f'`{w}`' for w in facts['weight_versions'])}"
                  + (" (**the weights changed during the run**: the `weight_version` column says which "
                     "made each row)" if len(facts["weight_versions"]) > 1 else "") + ".", "",
                  "| server | SGLang | model path | served name | weight version | first answer |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {_cell(o.server)} | {_cell(o.sglang_version)} | {_cell(o.model_path)} | "
                  f"{_cell(o.served_model_name)} | {_cell(o.weight_version)} | {_when(o.first_seen)} |"
                  for o in origins]
    else:
        lines.append("No server was recorded for this run (its samples came before provenance was kept).")
    lines += ["", "## Tokenizer and template", "",
              f"- tokenizer: `{spec.tokenizer}`",
              f"- tokenizer fingerprint: `{spec.tokenizer_fingerprint}`",
              f"- chat template fingerprint: `{spec.template_fingerprint}`",
              f"- thinking: `{spec.thinking}` (think-start id {spec.think_start_id}, think-end id "
              f"{spec.think_end_id}); stop ids {list(spec.stop_ids)}",
              f"- turns: `{spec.turns}`", "",
              "## Sampling", "",
              "```json", json.dumps(facts["sampling"], indent=2, sort_keys=True), "```", "",
              f"- samples per prompt: {facts['samples_per_prompt']}"
              + (f", until {facts['until_verified']} pass the verifier" if facts["until_verified"] else ""),
              f"- seeds: {SEED_RULE}"]
    if facts["logprobs"]:
        lines.append(f"- log-probabilities: top {facts['logprobs']} of each output token")
    lines += ["", "## Verifier", "",
              f"- verifier: {('`' + facts['verifier'] + '`') if facts['verifier'] else 'none'} "
              f"(every sample's think structure is checked by token id)",
              f"- rules switched off: {', '.join(facts['disabled_rules']) or 'none'}", ""]
    if facts["verdicts"]:
        lines += ["| verdict | samples |", "|---|---|"]
        lines += [f"| {_cell(k)} | {v:,} |" for k, v in facts["verdicts"].items()]
        lines.append("")
    lines += ["## Dead letters", ""]
    if facts["dead_letters"]:
        lines += ["| reason | samples |", "|---|---|"]
        lines += [f"| {_cell(k)} | {v:,} |" for k, v in facts["dead_letters"].items()]
        lines += ["", "`python -m producer dead list --run " + spec.name + "` names each; "
                  "the reason codes are in the fleet's docs (reference/reason-codes)."]
    else:
        lines.append("None.")
    lines += ["", "## Files", ""]
    lines += [f"- `{f['name']}`: {counted(f.get('rows', 0), 'row')}" for f in manifest.get("files", [])]
    lines += ["", "`manifest.json` lists them with their SHA-256 and the run's whole spec.", ""]
    return "\n".join(lines)


def _when(stamp: float | None) -> str:
    if not stamp:
        return "-"
    return datetime.fromtimestamp(float(stamp), timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _cell(value: object) -> str:
    """A table cell: a value as text, with nothing that breaks a Markdown table row."""
    if value is None or value == "":
        return "-"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _yaml(value: object, indent: int = 0) -> str:
    """Block YAML for plain data (JSON strings are valid YAML scalars, so every scalar is JSON)."""
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return "{}\n"
        out = []
        for k, v in value.items():
            key = json.dumps(str(k)) if not str(k).replace("_", "").isalnum() else str(k)
            if isinstance(v, (dict, list)) and v:
                out.append(f"{pad}{key}:\n{_yaml(v, indent + 2)}")
            else:
                out.append(f"{pad}{key}: {_scalar(v)}\n")
        return "".join(out)
    if isinstance(value, list):
        if not value:
            return "[]\n"
        out = []
        for v in value:
            if isinstance(v, (dict, list)) and v:
                body = _yaml(v, indent + 2)
                out.append(f"{pad}- {body.lstrip()}")
            else:
                out.append(f"{pad}- {_scalar(v)}\n")
        return "".join(out)
    return f"{pad}{_scalar(value)}\n"


def _scalar(value: object) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return {"nan": ".nan", "inf": ".inf", "-inf": "-.inf"}[repr(value)]
        mantissa, e, exponent = repr(value).partition("e")  # YAML 1.1 reads 1e-06 as text, 1.0e-06 as a number
        return (mantissa if "." in mantissa else mantissa + ".0") + (e + exponent if e else "")
    return json.dumps(value)
