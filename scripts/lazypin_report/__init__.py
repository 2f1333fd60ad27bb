"""lazypin report: read lazypin logs (JSON Lines, docs/log-format.md) and print
what the program's host-memory registration calls cost, what the pool saved,
why it did not save more (advice), and which code pins (call sites).

    lazypin report LOG... [--compare OTHER...] [--plot FILE.png] [--json] [--top N]

The modules follow the data: read (logs, streamed: each record updates a
latency histogram of its group and is dropped, so memory does not grow with
the number of records) -> aggregate (one document per run) -> savings (the
one definition of every saving shown), advice, callsites -> render (text;
--json prints the document) or compare, plot; brief is `lazypin run`'s
closing lines; cli the command line. Standard library only; matplotlib is
imported lazily, for --plot alone.
Exit status: 0 report printed (with warnings, if any); 1 printed, but the
--plot asked for not written; 2 bad usage or unusable input.
Run as `lazypin report ...`, `python3 lazypin_report.py ...` (the wrapper
beside this package) or `python3 path/to/lazypin_report ...`.
"""

from .base import *  # noqa: F401,F403
from .fmt import *  # noqa: F401,F403
from .read import *  # noqa: F401,F403
from .savings import *  # noqa: F401,F403
from .callsites import *  # noqa: F401,F403
from .advice import *  # noqa: F401,F403
from .aggregate import *  # noqa: F401,F403
from .compare import *  # noqa: F401,F403
from .render import *  # noqa: F401,F403
from .brief import *  # noqa: F401,F403
from .plot import *  # noqa: F401,F403
from .cli import build_parser, main  # noqa: F401
