"""Run names are names: they become Redis key parts and folders under OUTPUT_DIR."""
from __future__ import annotations

import pytest

from contract.spec import BadRunName, check_run_name

BAD = ["", "../../x", "..", "a/../b", "/abs/path", "a/b", "a\\b", "a:b", ".hidden", "-flag", "a b", "a\nb",
       "a*", "é", "x" * 129, "a..b"]
GOOD = ["default", "run-2026.12.01", "A_b-c.d", "7", "x" * 128]


@pytest.mark.parametrize("name", BAD, ids=repr)
def test_a_name_that_could_leave_its_folder_or_share_keys_is_refused(name):
    with pytest.raises(BadRunName, match="is not allowed"):
        check_run_name(name)


@pytest.mark.parametrize("name", GOOD)
def test_a_plain_name_is_kept(name):
    assert check_run_name(name) == name
