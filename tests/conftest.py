"""Session-wide test settings."""

from instruments.machine import describe_cpu


def pytest_report_header() -> str:
    # CI machines of one kind differ (AVX2 only, AVX-512, AMX); a failure report must say which ran it.
    return describe_cpu()
