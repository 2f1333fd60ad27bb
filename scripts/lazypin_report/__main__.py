"""`python3 path/to/lazypin_report LOG...`: the report, as `lazypin report LOG...`."""

import importlib
import os
import sys

if __package__:
    from .cli import main
else:
    # Run as a directory: import the package from its parent, never its
    # modules from the package's own directory as top-level modules.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    sys.path.insert(0, os.path.dirname(_here))
    main = importlib.import_module(os.path.basename(_here) + ".cli").main

sys.exit(main())
