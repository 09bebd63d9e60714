"""ctest's entry to the Python tests: pytest when it is installed, else exit 77 (ctest: skipped) saying so."""

import sys

try:
    import pytest
except ImportError:
    print("python_tests skipped: pytest is not installed (python3 -m pip install pytest)")
    sys.exit(77)

sys.exit(pytest.main(sys.argv[1:]))
