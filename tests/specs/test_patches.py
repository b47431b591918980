"""Specification: a replacement of a library's function is installed once per builder, and the
library's own function stays readable under it (`contract/patches.py`)."""
from __future__ import annotations

from contract import patches


class Library:
    def greet(self) -> list[str]:
        return ["library"]


def louder(under):
    def greet(self):
        return ["louder", *under(self)]
    return greet


def polite(under):
    def greet(self):
        return ["polite", *under(self)]
    return greet


def test_given_a_replacement_installed_twice_when_called_then_it_runs_once_on_the_library_function():
    class Owner(Library):
        greet = Library.greet

    patches.replace(Owner, "greet", louder)
    patches.replace(Owner, "greet", louder)

    assert Owner().greet() == ["louder", "library"]
    assert patches.library_own(Owner.greet) is Library.greet


def test_given_two_builders_when_installed_then_they_stack_and_reinstalling_the_top_one_rebuilds_it_only():
    class Owner(Library):
        greet = Library.greet

    patches.replace(Owner, "greet", louder)
    patches.replace(Owner, "greet", polite)
    patches.replace(Owner, "greet", polite)

    assert Owner().greet() == ["polite", "louder", "library"]
    assert patches.built_by(Owner.greet, polite) and not patches.built_by(Owner.greet, louder)
    assert patches.library_own(Owner.greet) is Library.greet


def test_given_a_library_function_when_not_replaced_then_it_reads_as_its_own():
    assert not patches.is_replaced(Library.greet)
    assert patches.library_own(Library.greet) is Library.greet
