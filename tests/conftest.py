"""Session-wide test settings."""

import pytest

from instruments.machine import describe_cpu


def pytest_report_header() -> str:
    # CI machines of one kind differ (AVX2 only, AVX-512, AMX); a failure report must say which ran it.
    return describe_cpu()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The groups that launch verl's trainer first, then the other groups, then the single tests.

    Under ``--dist loadgroup --no-loadscope-reorder`` (scripts/test.sh), pytest-xdist hands out its work units (a
    group, or one ungrouped test) in this order: longest first, so that no trainer group starts late and holds the
    wall on its own (by default xdist orders units by their number of tests, which put both trainer groups behind
    five config groups). Measured on 2 AVX2 cores, the suite was bound by its total CPU work either way
    (results/journal.md, "The test budget by kind of CPU").
    """

    def group(item: pytest.Item) -> str | None:
        mark = item.get_closest_marker("xdist_group")
        return str(mark.args[0]) if mark is not None else None

    trainer_groups = {group(item) for item in items if item.get_closest_marker("e2e")} - {None}

    def rank(item: pytest.Item) -> int:
        name = group(item)
        return 0 if name in trainer_groups else 1 if name is not None else 2

    items.sort(key=rank)
