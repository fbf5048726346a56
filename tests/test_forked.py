"""``inagg.bmv2_env.emulation.forked.exit_now``: the way a forked service and a finished rank
end, in a process of its own."""

import subprocess
import sys

SCRIPT = """
import atexit, sys
from inagg.bmv2_env.emulation.forked import exit_now
atexit.register(lambda: print("exit handler ran", flush=True))
print("reported", end="")             # buffered: stdout is a pipe
print("on stderr", end="", file=sys.stderr)
exit_now(3)
print("after exit_now")
"""


def test_exit_now_writes_what_was_buffered_and_ends_with_its_status_running_no_exit_handler():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "reported", "on stderr")
