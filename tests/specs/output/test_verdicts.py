"""Specification: the verifiers `enqueue --verify NAME` names (contract/run/verifiers.py), and their
checks run in a process of their own (workers/output/verdicts.py), where one that raises, hangs or
dies costs its answer an `error` verdict and nothing else."""
from __future__ import annotations

import sys
import textwrap
import time

import pytest

from contract.run.verifiers import BadVerifier, check_importable, judge, last_boxed, parse_name, verdict_class
from workers.output.verdicts import Verdicts


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A user's verifier module, importable here and in the check processes (PYTHONPATH)."""
    (tmp_path / "my_checks.py").write_text(textwrap.dedent("""
        import os, time

        def by_field(fields, answer):
            return fields["expect"] == "pass"

        def labelled(fields, answer):
            return answer.startswith("42"), "starts_with_42" if answer.startswith("42") else "wrong_start"

        def raises(fields, answer):
            raise ValueError("no luck")

        def hangs(fields, answer):
            time.sleep(3600)

        def dies(fields, answer):
            os._exit(9)

        def chatty(fields, answer):
            print("this goes to the log, not into the replies")
            return True

        def odd(fields, answer):
            return "yes"

        not_a_function = 3
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return "my_checks"


# -- names ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,kind", [("math", "math"), ("exact", "exact"), ("regex:^4[0-9]$", "regex"),
                                       ("pkg.checks:grade", "function")])
def test_each_kind_of_name_is_understood(name, kind):
    assert parse_name(name).kind == kind


@pytest.mark.parametrize("name,why", [("maths", "names no verifier"), ("regex:(", "not a regular expression"),
                                      ("checks:", "names no verifier"), (":grade", "names no verifier"),
                                      ("a-b:grade", "names no verifier")])
def test_a_name_that_names_no_verifier_is_refused(name, why):
    with pytest.raises(BadVerifier, match=why):
        parse_name(name)


def test_a_function_that_does_not_import_is_refused_at_enqueue(user_module):
    check_importable(parse_name(f"{user_module}:by_field"))
    with pytest.raises(BadVerifier, match="cannot import"):
        check_importable(parse_name(f"{user_module}:missing"))
    with pytest.raises(BadVerifier, match="cannot import"):
        check_importable(parse_name("no_such_module_here:grade"))
    with pytest.raises(BadVerifier, match="not callable"):
        check_importable(parse_name(f"{user_module}:not_a_function"))


# -- the built-ins ----------------------------------------------------------------------------

def test_math_compares_the_last_boxed_answer_with_the_answer_field_by_value():
    math = parse_name("math")
    assert judge(math, {"answer": "0.5"}, "So it is \\boxed{1/2}.") == (True, "pass")
    assert judge(math, {"answer": "\\frac{1}{2}"}, "first \\boxed{3}, then \\boxed{0.5}") == (True, "pass")
    assert judge(math, {"answer": 2}, "\\boxed{\\frac{4}{2}}") == (True, "pass")
    assert judge(math, {"answer": "0.5"}, "\\boxed{0.25}") == (False, "fail")


def test_math_without_a_boxed_answer_fails_as_no_boxed():
    assert judge(parse_name("math"), {"answer": "0.5"}, "It is one half.") == (False, "no_boxed")


def test_the_last_boxed_answer_keeps_its_nested_braces():
    assert last_boxed("\\boxed{1} and \\boxed{\\frac{1}{2}} end") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{never closed") is None and last_boxed("none") is None


def test_exact_compares_the_stripped_answer_with_the_answer_field_as_text():
    exact = parse_name("exact")
    assert judge(exact, {"answer": "Paris"}, "  Paris\n") == (True, "pass")
    assert judge(exact, {"answer": 42}, "42") == (True, "pass")
    assert judge(exact, {"answer": "Paris"}, "paris") == (False, "fail")


def test_regex_passes_where_the_pattern_is_found_in_the_answer():
    regex = parse_name("regex:(?i)answer:\\s*B\\b")
    assert judge(regex, {}, "...\nAnswer: B") == (True, "pass")
    assert judge(regex, {}, "Answer: C") == (False, "fail")


def test_a_user_function_returns_a_bool_or_a_bool_and_its_label(user_module):
    assert judge(parse_name(f"{user_module}:by_field"), {"expect": "pass"}, "") == (True, "pass")
    assert judge(parse_name(f"{user_module}:by_field"), {"expect": "no"}, "") == (False, "fail")
    assert judge(parse_name(f"{user_module}:labelled"), {}, "42!") == (True, "starts_with_42")
    assert judge(parse_name(f"{user_module}:labelled"), {}, "41") == (False, "wrong_start")


def test_verdicts_fall_in_three_classes():
    assert verdict_class(None, None) is None
    assert verdict_class(True, "starts_with_42") == "pass"
    assert verdict_class(False, "no_boxed") == "fail"
    assert verdict_class(False, "error: timeout after 10s") == "error"


# -- in a process of its own ------------------------------------------------------------------

def test_a_line_without_an_answer_field_is_an_error_not_a_fail():
    verdicts = Verdicts(timeout=30)
    try:
        assert verdicts.judge("exact", {"question": "?"}, "42") == (False, "error: no_answer")
        assert verdicts.judge("math", {"answer": "0.5"}, "\\boxed{1/2}") == (True, "pass")
    finally:
        verdicts.close()


def test_a_check_that_raises_hangs_or_dies_costs_its_answer_an_error_and_the_next_answer_is_checked(user_module):
    # Given a worker's check processes with a 2-second limit
    verdicts = Verdicts(timeout=2)
    try:
        # When a check raises, hangs, kills its process, or answers something else than a verdict
        raised = verdicts.judge(f"{user_module}:raises", {}, "x")
        started = time.monotonic()
        hung = verdicts.judge(f"{user_module}:hangs", {}, "x")
        waited = time.monotonic() - started
        died = verdicts.judge(f"{user_module}:dies", {}, "x")
        odd = verdicts.judge(f"{user_module}:odd", {}, "x")

        # Then each answer gets an `error` verdict that says what happened, the hang within its limit
        assert raised == (False, "error: ValueError: no luck")
        assert hung == (False, "error: timeout after 2s") and waited < 10
        assert died[0] is False and died[1].startswith("error: the verifier's process died")
        assert odd[0] is False and odd[1].startswith("error: the verifier returned str")
        # and the processes that took them are replaced: the next answers are checked as usual
        assert verdicts.judge(f"{user_module}:by_field", {"expect": "pass"}, "") == (True, "pass")
        assert verdicts.judge(f"{user_module}:chatty", {}, "") == (True, "pass")
    finally:
        verdicts.close()


def test_a_function_the_worker_cannot_import_is_every_answers_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    verdicts = Verdicts(timeout=5)
    try:
        verified, verdict = verdicts.judge("nowhere_to_be_found:grade", {}, "x")
    finally:
        verdicts.close()
    assert verified is False and verdict.startswith("error: --verify 'nowhere_to_be_found:grade': cannot import")


def test_the_check_process_runs_the_workers_own_python():
    verdicts = Verdicts(timeout=30)
    try:
        assert verdicts.judge("regex:x", {}, "x") == (True, "pass")
        child = verdicts._pools["regex:x"].get_nowait()
        assert child.proc.args[0] == sys.executable
    finally:
        verdicts.close()


def test_a_worker_holding_more_than_1024_descriptors_still_checks_answers():
    # Given a process with descriptors numbered past select()'s 1,024 (a busy worker's connections)
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"this machine allows {hard} descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    verdicts = Verdicts(timeout=30)
    try:
        # When an answer is checked
        # Then its verdict comes back as usual
        assert verdicts.judge("regex:4", {}, "42") == (True, "pass")
    finally:
        verdicts.close()
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# -- the answer a check reads -----------------------------------------------------------------

@pytest.fixture(scope="module")
def chat():
    from contract.chat.bundled import bundled_tokenizer_dir
    from contract.chat.template import ChatTokenizer

    return ChatTokenizer(str(bundled_tokenizer_dir()))


def run_spec(chat, thinking: str):
    import dataclasses

    from producer.enqueue import new_spec

    return dataclasses.replace(new_spec(chat, "r", chat.name, 64, 0.6, 0.95, thinking), verify="exact")


def test_the_answer_is_the_text_after_think_end_without_the_stop_token(chat):
    from workers.output.verdicts import answer_text

    spec = run_spec(chat, "prompt")
    reasoning, answer = chat.tok.encode("Half of one.", add_special_tokens=False), \
        chat.tok.encode("  \\boxed{0.5}\n", add_special_tokens=False)
    output = reasoning + [spec.think_end_id] + answer + spec.stop_ids[:1]
    assert answer_text(spec, output) == "\\boxed{0.5}"


def test_in_a_run_that_does_not_think_the_answer_is_the_whole_output(chat):
    from workers.output.verdicts import answer_text

    spec = run_spec(chat, "off")
    output = chat.tok.encode("a </think> b", add_special_tokens=False) + spec.stop_ids[:1]
    assert answer_text(spec, output) == "a </think> b"
