"""Run TF Serving's own tensorflow_model_server_test.py against `exportkit serve`.

The test file (and its test_util base) is read from a tensorflow/serving git mirror into a temp dir, never into
the project. It starts `$TEST_SRCDIR/tf_serving/tensorflow_serving/model_servers/tensorflow_model_server` with
TF Serving's flags: that is a shim running `exportkit serve "$@"`. Its test data (servables/tensorflow/testdata)
is built by tests/tfs_models.py with models of our own. Prints one line per test and a summary.

    python tools/run_tfs_suite.py [--mirror /work/.mirror/tensorflow+serving/repo] [--ref HEAD] [-k PATTERN]

Needs portpicker and six (the test base imports them): pip install portpicker six.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = ("tensorflow_serving/model_servers/tensorflow_model_server_test.py",
         "tensorflow_serving/model_servers/test_util/tensorflow_model_server_test_base.py")

RUNNER = textwrap.dedent('''
    import os, sys, unittest
    import tensorflow_serving
    tensorflow_serving.__path__.append(os.path.join(sys.argv[1], "tensorflow_serving"))  # its model_servers/
    from absl import flags
    sys.argv = sys.argv[:1] + ["--test_tmpdir=" + os.environ["TEST_TMPDIR"]]
    import runpy
    ns = runpy.run_path(os.path.join(os.environ["TFS_SUITE_DIR"],
                                     "tensorflow_serving/model_servers/tensorflow_model_server_test.py"),
                        run_name="tfs_suite")
    flags.FLAGS(sys.argv)
    pattern = os.environ.get("TFS_SUITE_K", "")
    loader = unittest.TestLoader()
    suite = unittest.TestSuite(t for t in loader.loadTestsFromTestCase(ns["TensorflowModelServerTest"])
                               if pattern in t.id())
    tests = list(suite)  # the runner empties the suite as it goes
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stderr).run(suite)
    problems = {t.id(): (kind, text) for kind, items in (("FAIL", result.failures), ("ERROR", result.errors))
                for t, text in items}
    print("\\n== TF Serving tensorflow_model_server_test.py against exportkit serve ==")
    for test in tests:
        kind, text = problems.get(test.id(), ("PASS", ""))
        last = [line for line in text.strip().splitlines() if line.strip()][-1:] if text else []
        print(f"{kind:5} {test.id().split('.')[-1]}" + (f"  -- {last[0].strip()[:300]}" if last else ""))
    print(f"passed {len(tests) - len(problems)} of {len(tests)}")
''')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", default="/work/.mirror/tensorflow+serving/repo", help="tensorflow/serving git dir")
    parser.add_argument("--ref", default="HEAD")
    parser.add_argument("-k", default="", help="run only tests whose id contains this")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    parser.add_argument("--legacy-keras", action="store_true",
                        help="TF_USE_LEGACY_KERAS=1: tf.keras is Keras 2 (tf-keras), which the test file was written "
                             "for; under Keras 3 its Sequential models' signature input is `inputs`, not `x`")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup below when stopped

    tmp = tempfile.mkdtemp(prefix="tfs-suite-")
    try:
        for path in FILES:
            text = subprocess.run(["git", f"--git-dir={args.mirror}", "show", f"{args.ref}:{path}"], check=True,
                                  capture_output=True).stdout
            os.makedirs(os.path.join(tmp, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(tmp, path), "wb") as handle:
                handle.write(text)
        for package in ("tensorflow_serving/model_servers", "tensorflow_serving/model_servers/test_util"):
            open(os.path.join(tmp, package, "__init__.py"), "w").close()

        srcdir = os.path.join(tmp, "srcdir")
        servers = os.path.join(srcdir, "tf_serving", "tensorflow_serving", "model_servers")
        testdata = os.path.join(srcdir, "tf_serving", "tensorflow_serving", "servables", "tensorflow", "testdata")
        os.makedirs(servers)
        os.makedirs(testdata)
        exportkit = os.path.join(os.path.dirname(sys.executable), "exportkit")
        shim = os.path.join(servers, "tensorflow_model_server")
        with open(shim, "w") as handle:
            handle.write(f'#!/bin/sh\nexec "{exportkit}" serve "$@"\n')
        os.chmod(shim, 0o755)
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        from tfs_models import build_testdata

        print(f"building test data in {testdata} ...", flush=True)
        build_testdata(testdata)

        env = dict(os.environ, TEST_SRCDIR=srcdir, TEST_TMPDIR=os.path.join(tmp, "tmp"), TFS_SUITE_DIR=tmp,
                   TFS_SUITE_K=args.k)
        if args.legacy_keras:
            env["TF_USE_LEGACY_KERAS"] = "1"
        os.makedirs(env["TEST_TMPDIR"])
        runner = os.path.join(tmp, "runner.py")
        with open(runner, "w") as handle:
            handle.write(RUNNER)
        proc = subprocess.Popen([sys.executable, runner, tmp], env=env, cwd=tmp, start_new_session=True)
        try:
            return proc.wait()
        finally:  # the servers the test started live in the runner's session: end them with it
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
