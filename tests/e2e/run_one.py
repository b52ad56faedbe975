"""Runs one end-to-end test (module.Class.method) for ctest: exit 0 when it passed, 77 when it
was skipped (ctest's SKIP_RETURN_CODE, so a skip shows as a skip, never as a pass), 1 when it
failed or raised."""
import sys
import unittest

SKIPPED = 77

test_id = sys.argv[1]
suite = unittest.defaultTestLoader.loadTestsFromName(test_id)
result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
if not result.wasSuccessful() or result.testsRun == 0:
    sys.exit(1)
if result.skipped and len(result.skipped) == result.testsRun:
    for _, reason in result.skipped:
        print(f"skipped: {reason}")
    sys.exit(SKIPPED)
sys.exit(0)
