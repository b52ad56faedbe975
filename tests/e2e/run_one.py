"""Runs one end-to-end test (module.Class.method) for ctest: exit 0 when it passed, 77 when it
was skipped (ctest's SKIP_RETURN_CODE, so a skip shows as a skip, never as a pass), 1 when it
failed or raised."""
import os
import sys
import unittest
import zlib

SKIPPED = 77


def keep_to_the_allocated_core():
    """A harness.one_core test run under ctest's resource allocation (tests/CMakeLists.txt)
    holds one of the `cores` of build/tests/cores.json: this process, and so every process it
    starts (mpiexec and its ranks, which then see one core, so autoaccum takes one thread), keeps
    to that core, the id-th of the cores this process may use."""
    if int(os.environ.get("CTEST_RESOURCE_GROUP_COUNT", "0")) < 1:
        return
    given = dict(item.split(":") for item in os.environ["CTEST_RESOURCE_GROUP_0_CORES"].split(","))
    allowed = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {allowed[int(given["id"]) % len(allowed)]})
    # mpiexec would bind its ranks to cores of its own choosing (Open MPI 4: one core each for
    # up to 2 ranks), whatever core it was started on: it binds nothing, so they keep this one.
    os.environ["OMPI_MCA_hwloc_base_binding_policy"] = "none"  # Open MPI 4
    os.environ["PRTE_MCA_hwloc_default_binding_policy"] = "none"  # Open MPI 5 (PRRTE)


test_id = sys.argv[1]
keep_to_the_allocated_core()
suite = unittest.defaultTestLoader.loadTestsFromName(test_id)
if "torch" in sys.modules:  # the test's own computations: as many threads as it has cores
    sys.modules["torch"].set_num_threads(len(os.sched_getaffinity(0)))
# Models that tests build without a seed of their own start from weights drawn from a seed of
# the test's name: a run repeats the last one bit for bit, so a tolerance that one draw in fifty
# would miss fails every time or never (one random initialisation once put bf16's and fp32's
# evaluations of a model 4.9e-6 apart and failed a check set at 1e-5).
if "torch" in sys.modules:
    sys.modules["torch"].manual_seed(zlib.crc32(test_id.encode()))
result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
if not result.wasSuccessful() or result.testsRun == 0:
    sys.exit(1)
if result.skipped and len(result.skipped) == result.testsRun:
    for _, reason in result.skipped:
        print(f"skipped: {reason}")
    sys.exit(SKIPPED)
sys.exit(0)
