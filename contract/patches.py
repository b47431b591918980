"""Our replacements of a library's functions, each knowing the function it stands on.

The fleet changes a few of kombu's and Celery's functions (`kombu_redis`,
`kombu_listen`). A replacement is installed where a module is imported, and
some are installed again with new arguments (a test's own client, a second
callback); built on whatever the attribute holds then, the second would wrap
the first and do its work twice. So each replacement carries the function it
stands on and the builder that made it: `replace` rebuilds a replacement of the
same builder on what that one stood on, never on top of it, and a check of the
library (`kombu_redis.check`) reads the library's own code under every
replacement (`library_own`). Replacements by different builders stack, in the
order they were installed.
"""
from __future__ import annotations

from typing import Any, Callable

STANDS_ON = "fleet_stands_on"  # on a replacement: the function it replaced
BUILT_BY = "fleet_built_by"    # on a replacement: its builder's qualified name


def replace(owner: Any, name: str, build: Callable[[Any], Callable]) -> Callable:
    """Set `owner.<name>` to `build(the function under it)`: what it holds now, or, where that
    is `build`'s own replacement, what that one stood on. Returns the replacement."""
    current = getattr(owner, name)
    under = getattr(current, STANDS_ON) if built_by(current, build) else current
    replacement = build(under)
    setattr(replacement, STANDS_ON, under)
    setattr(replacement, BUILT_BY, build.__qualname__)
    setattr(owner, name, replacement)
    return replacement


def built_by(found: Any, build: Callable) -> bool:
    """Whether `found` is a replacement `build` made."""
    return getattr(found, BUILT_BY, None) == build.__qualname__


def is_replaced(found: Any) -> bool:
    """Whether `found` is one of our replacements."""
    return hasattr(found, STANDS_ON)


def library_own(found: Any) -> Any:
    """`found` as the library defined it, under every replacement of ours."""
    while hasattr(found, STANDS_ON):
        found = getattr(found, STANDS_ON)
    return found
