"""paho-run.py: run one test of an Eclipse Paho interoperability client test
file (client_test.py or client_test5.py) against a broker.

Usage: python3 paho-run.py SUITE_DIR FILE HOST PORT TEST

The suite's files parse --hostname/--port themselves, then call
unittest.main(), which parses sys.argv a second time and rejects those same
options (client_test5.py strips -p but not --hostname; in both files the
check `o in ("--help")` is a substring test, so -h prints the usage and
exits). So this shim gives the file its own options, in the long forms that
its parser accepts, and lets unittest.main run only TEST, verbosely.
Nothing of the suite is changed or copied.
"""
import os
import runpy
import sys
import unittest

suite_dir, file, host, port, test = sys.argv[1:6]
os.chdir(suite_dir)
sys.path.insert(0, suite_dir)
if file == "client_test5.py":
    # client_test5.py removes "-p" and its value from sys.argv; keep it so.
    sys.argv = [file, "--hostname=" + host, "-p", port]
else:
    sys.argv = [file, "--hostname=" + host, "--port=" + port]

_main = unittest.main


def _run_one(*args, **kwargs):
    kwargs["argv"] = [file, "-v", "Test." + test]
    return _main(*args, **kwargs)


unittest.main = _run_one
runpy.run_path(file, run_name="__main__")
