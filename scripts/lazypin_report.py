#!/usr/bin/env python3
"""`python3 lazypin_report.py LOG...` is `lazypin report LOG...` (docs/tools.md).

The report is the package lazypin_report/ beside this file; this file runs
it and holds its names (`import`ed by file, as the tests do)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lazypin_report import *  # noqa: E402,F401,F403
from lazypin_report import brief as _brief, main  # noqa: E402


def brief_summary(paths):
    """The package's brief_summary, past this module's BRIEF_READ_LIMIT bytes
    of logs from the shim's summaries alone."""
    return _brief.brief_summary(paths, read_limit=BRIEF_READ_LIMIT)


if __name__ == "__main__":
    sys.exit(main())
