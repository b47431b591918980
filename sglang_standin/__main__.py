"""`python -m sglang_standin --port N [options]`: run a fake SGLang server."""

from __future__ import annotations

import sys
from typing import Sequence

from sglang_standin.cli import parse_config
from sglang_standin.runner import run


def main(argv: Sequence[str] | None = None) -> int:
    run(parse_config(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
