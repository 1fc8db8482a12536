"""The package's tests: `tests/<package>/test_<module>.py` tests
`<package>/<module>.py` (`test_<package>.py` its `__init__`); the tests of
the whole package (the driver, the docs, the conformance suite over every
builder, the import rules) sit here. `test_import_graph.py` holds the rule.
"""

import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
