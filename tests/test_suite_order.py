"""The suite's file order (tests/conftest.py): ``slow_first.txt`` names test files that exist, once
each, so a renamed or removed file is caught here instead of silently running last."""

from pathlib import Path

from conftest import slow_first

TESTS = Path(__file__).parent


def test_slow_first_names_each_existing_test_file_once():
    lines = [line.strip() for line in (TESTS / "slow_first.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert len(lines) == len(set(lines)) == len(slow_first())
    missing = [name for name in lines if not (TESTS / name).is_file()]
    assert not missing, f"slow_first.txt names test files that do not exist: {missing}"
