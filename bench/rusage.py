"""``python bench/rusage.py CMD ...``: run CMD (stdout and stderr inherited), then print one line
``RUSAGE {json}`` with what ``/usr/bin/time -v`` reports of CMD and every descendant it waited for
(``os.wait4``): user and system CPU seconds, minor and major page faults, and the largest peak
resident set of any one of those processes (MiB). Exits with CMD's status.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    proc = subprocess.Popen(argv)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; keeps Popen from waiting again
    print(
        "RUSAGE "
        + json.dumps(
            {
                "user_s": usage.ru_utime,
                "sys_s": usage.ru_stime,
                "minflt": usage.ru_minflt,
                "majflt": usage.ru_majflt,
                "maxrss_mb": usage.ru_maxrss / 1024.0,
            }
        ),
        flush=True,
    )
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
