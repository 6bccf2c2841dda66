"""Runs the interop suites: `tests/interop/run [SUITE...]` (see README, "Interop")."""

import importlib.util
import os
import subprocess
import sys
import time
import traceback

import harness

SUITES = sorted(
    p.name
    for p in harness.INTEROP.iterdir()
    if p.is_dir() and (p / "suite.py").exists()
)


def main(argv):
    wanted = argv or SUITES
    unknown = [s for s in wanted if s not in SUITES]
    if unknown:
        print(f"unknown suite(s) {unknown}; suites: {' '.join(SUITES)}")
        return 2
    # Absolute, because suites start processes from other working directories.
    binary = os.path.abspath(
        os.environ.get("EGRESSD_BIN") or harness.ROOT / "target" / "debug" / "egressd"
    )
    failed = []
    for suite in wanted:
        print(f"== {suite}")
        started = time.monotonic()
        setup = harness.INTEROP / suite / "setup"
        if setup.exists():
            # Installs the suite's pinned peers into target/interop (quick when cached). A
            # peer that cannot be installed fails the suite: nothing is skipped silently.
            if subprocess.run([str(setup)], cwd=harness.ROOT).returncode != 0:
                print(f"!! {suite}: setup failed")
                failed.append(suite)
                continue
        spec = importlib.util.spec_from_file_location(suite, harness.INTEROP / suite / "suite.py")
        module = importlib.util.module_from_spec(spec)
        h = harness.Harness(suite, binary)
        try:
            spec.loader.exec_module(module)
            module.run(h)
        except Exception as e:  # a suite that breaks is a failed suite, with its story
            traceback.print_exc()
            h.failures.append(f"error: {e}")
            for proc in h.procs:
                log = h.log_of(proc)
                if log:
                    print(f"-- {proc.name} log (last 40 lines)")
                    print("\n".join(log.splitlines()[-40:]))
        finally:
            h.stop_all()
        took = time.monotonic() - started
        if h.failures:
            print(f"!! {suite}: {len(h.failures)} of {h.checks} checks failed ({took:.0f}s)")
            failed.append(suite)
        else:
            print(f"   {suite}: {h.checks} checks, same direct and through egressd ({took:.0f}s)")
    if failed:
        print(f"interop: failed: {' '.join(failed)}")
        return 1
    print(f"interop: {len(wanted)} suite(s) passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
