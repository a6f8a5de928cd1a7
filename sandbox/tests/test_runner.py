"""gpuserve_sandbox.runner: what a failed pyinfra run reports."""

import pytest

from gpuserve_sandbox.runner import PyinfraRun

# what pyinfra 3 printed for /tmp/d.py (an "ok op", then a "bad op" that fails on one host)
OUTPUT = """\
--> Beginning operation run...
--> Starting operation: ok op
    [h1] Success
    [h2] Success

--> Starting operation: bad op
    [h2] Success
    [h1] out-line
    [h1] err-line
    [h1] Error: executed 0 commands

--> Starting operation: later op
    [h2] No changes

--> Results:
    Grand total   3   2   1   1
--> Disconnecting from hosts...
"""


def test_failures_are_the_failed_operations_with_their_output():
    run = PyinfraRun(["-y", "inv.py", "d.py"], 1, OUTPUT, 1.0)
    assert run.failures() == ["--> Starting operation: bad op", "    [h2] Success",
                              "    [h1] out-line", "    [h1] err-line",
                              "    [h1] Error: executed 0 commands", ""]
    assert (run.changed, run.errors, run.unchanged) == (2, 1, 1)


def test_check_names_the_failed_operation_before_the_tail():
    run = PyinfraRun(["-y", "inv.py", "d.py"], 1, OUTPUT + "x" * 5000, 1.0)
    with pytest.raises(AssertionError) as err:
        run.check()
    text = str(err.value)
    assert "bad op" in text and "err-line" in text
    assert text.index("err-line") < text.index("The end of its output")


def test_check_passes_a_run_that_exited_0():
    run = PyinfraRun([], 0, OUTPUT, 1.0)
    assert run.check() is run
