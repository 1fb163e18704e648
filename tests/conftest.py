"""The cross-package tests' folder is importable from its tests (``import acp_tree``): the
helpers that several of them share live beside them (``--import-mode=importlib`` puts no test
folder on ``sys.path`` by itself)."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
