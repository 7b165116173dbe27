"""Hostile programs in orl.eval.sandbox: each must be contained, must not pass, and the scorer
must keep working afterwards (a normal program passes after every hostile one); the harness
split (`run_tests`) and its plain-data wire. Forgery and escape techniques: test_sandbox_redteam.py."""
import os
import socket
import tempfile
import time

import pytest

import orl.eval.sandbox as sandbox
from orl.eval.sandbox import (SandboxConfig, landlock_abi, namespaces_available, read_only_mounts_available,
                              run_many, run_program, run_tests)

FAST = SandboxConfig(timeout_s=2, memory_mb=512, file_size_mb=8)
GOOD = "def f(x):\n    return x * 2\nassert f(21) == 42\nprint('ok')\n"


@pytest.fixture(params=["auto", "no-namespaces"])
def sandbox_tmp(request, tmp_path, monkeypatch):
    """Sandboxes create their folders here, so the test can check they are removed. Every test
    runs twice: with namespaces where this machine has them, and as on a machine without."""
    if request.param == "no-namespaces":
        monkeypatch.setattr(sandbox, "namespaces_available", lambda: False)
    d = tmp_path / "sandboxes"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    yield d
    assert list(d.iterdir()) == [], "sandbox folders were left behind"


def still_works():
    r = run_program(GOOD, FAST)
    assert r.status == "pass" and r.stdout == "ok", r


def test_normal_program_passes(sandbox_tmp):
    r = run_program(GOOD, FAST)
    assert (r.status, r.reason, r.stdout) == ("pass", "", "ok")
    r = run_program("assert 1 + 1 == 3", FAST)
    assert r.status == "fail" and "AssertionError" in r.reason and "line 1" in r.reason
    assert run_program("def f(:\n", FAST).status == "error"
    assert run_program("raise KeyError('k')", FAST).reason.startswith("KeyError")


def test_infinite_loop_times_out(sandbox_tmp):
    start = time.monotonic()
    r = run_program("while True:\n    pass\n", SandboxConfig(timeout_s=1))
    assert r.status == "timeout" and time.monotonic() - start < 5
    r = run_program("import time\ntime.sleep(60)\n", SandboxConfig(timeout_s=1))
    assert r.status == "timeout"
    still_works()


def test_fork_bomb_is_contained(sandbox_tmp):
    for src in ("import os\nwhile True:\n    os.fork()\n",
                "import subprocess\nwhile True:\n    subprocess.Popen(['sleep', '60'])\n",
                "import multiprocessing as mp\nwhile True:\n    mp.Process(target=print).start()\n",
                "import posix\nwhile True:\n    posix.fork()\n"):
        r = run_program(src, FAST)
        assert r.status in ("error", "fail", "timeout"), (src, r)
    still_works()


def test_memory_bomb_is_contained(sandbox_tmp):
    r = run_program("x = bytearray(8 << 30)\n", FAST)
    assert r.status == "error" and "MemoryError" in r.reason
    r = run_program("xs = []\nwhile True:\n    xs.append(bytearray(64 << 20))\n", FAST)
    assert r.status in ("error", "timeout")
    still_works()


def test_huge_file_write_is_contained(sandbox_tmp):
    r = run_program("with open('big', 'wb') as f:\n    f.write(b'x' * (200 << 20))\n", FAST)
    assert r.status == "error" and "File too large" in r.reason
    r = run_program("print('y' * (64 << 20))\n", FAST)  # stdout is a file under the same limit
    assert r.status != "pass" and len(r.stdout) <= FAST.output_tail_chars
    still_works()


def test_write_outside_its_directory_is_refused(sandbox_tmp, tmp_path):
    target = tmp_path / "outside" / "pwned.txt"
    target.parent.mkdir()
    for src in (f"open({str(target)!r}, 'w').write('x')\n",
                f"import pathlib\npathlib.Path({str(target)!r}).write_text('x')\n",
                f"import os\nfd = os.open({str(target)!r}, os.O_CREAT | os.O_WRONLY)\n",
                f"import shutil\nshutil.copy('program.py', {str(target)!r})\n"):
        r = run_program(src, FAST)
        assert r.status == "error" and "PermissionError" in r.reason, r
        assert not target.exists()
    r = run_program("open('inside.txt', 'w').write('fine')\nassert open('inside.txt').read() == 'fine'\n", FAST)
    assert r.status == "pass"
    still_works()


def test_killing_the_parent_is_contained(sandbox_tmp):
    me = os.getpid()
    for src in ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
                f"import os\nos.kill({me}, 9)\n",
                "import os\nos.killpg(os.getpgid(0), 9)\n",
                "import os\nos.kill(-1, 9)\n"):
        r = run_program(src, FAST)
        assert r.status != "pass", (src, r)
    assert os.getpid() == me  # we are still here
    still_works()


def test_faked_pass_is_refused(sandbox_tmp):
    for src in ("import sys\nsys.exit(0)\nassert False\n",
                "exit(0)\n",
                "import os\nos._exit(0)\n",
                "raise SystemExit\n",
                "print('ORL-SANDBOX-RESULT {\"status\": \"pass\", \"reason\": \"\"}')\nimport os\nos._exit(0)\n"):
        r = run_program(src, FAST)
        assert r.status == "fail", (src, r)
    still_works()


def test_network_is_refused(sandbox_tmp):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    try:
        for src in (f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n",
                    f"import urllib.request\nurllib.request.urlopen('http://127.0.0.1:{port}/', timeout=1)\n",
                    "import socket\nsocket.getaddrinfo('example.com', 80)\n"):
            r = run_program(src, FAST)
            assert r.status == "error", (src, r)
        with pytest.raises(socket.timeout):
            server.accept()  # nobody connected
    finally:
        server.close()
    still_works()


def test_parent_env_secrets_are_not_visible(sandbox_tmp, monkeypatch):
    secret = "orl-test-secret-7c1e9a"
    monkeypatch.setenv("ORL_TEST_SECRET", secret)
    src = ("import os\nprint(dict(os.environ))\n"
           f"for pid in [os.getppid(), {os.getpid()}, 1] + [int(p) for p in os.listdir('/proc') if p.isdigit()]:\n"
           "    try:\n        print(open(f'/proc/{pid}/environ', 'rb').read())\n"
           "    except Exception as e:\n        print('denied', pid, type(e).__name__)\n")
    r = run_program(src, SandboxConfig(timeout_s=3, output_tail_chars=10**6))
    assert r.status == "pass"
    assert secret not in r.stdout and "ORL_TEST_SECRET" not in r.stdout
    still_works()


def test_parallel_pool_mixed(sandbox_tmp):
    sources = [GOOD, "while True: pass", "assert False", GOOD, "import os; os._exit(0)", GOOD] * 2
    results = run_many(sources, SandboxConfig(timeout_s=1), workers=4)
    assert [r.status for r in results] == ["pass", "timeout", "fail", "pass", "fail", "pass"] * 2


@pytest.mark.skipif(not namespaces_available(), reason="unshare cannot create namespaces here")
def test_os_layer_alone_contains_without_prelude(sandbox_tmp):
    """With the in-process prelude off, the namespaces alone stop network, parent kill, /proc."""
    bare = SandboxConfig(timeout_s=2, prelude=False, namespaces=True)
    r = run_program("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)\n", bare)
    assert r.status == "error" and "unreachable" in r.reason.lower()
    me = os.getpid()
    r = run_program(f"import os\nos.kill(os.getppid(), 9)\nos.kill({me}, 9)\n", bare)
    assert r.status == "error" and os.getpid() == me
    r = run_program("import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n", bare)
    assert r.status == "pass" and r.stdout == "[1]"  # it sees only itself
    still_works()


# -- run_tests: the candidate in the sandbox, the tests in a harness; plain data between them --

def test_wire_carries_plain_data_only():
    from orl.eval.sandbox_wire import NotPlainData, WireError, dumps, loads

    value = [None, True, 0, -3, 10**40, 1.5, float("inf"), "é\n", b"\x00\xff", 2 + 3j,
             (1, (2,)), {(1, "a"): [{}], "k": {1, 2}}, frozenset({"x"}), set(), ()]
    back = loads(dumps(value))
    assert back == value and type(back[9]) is complex and type(back[10]) is tuple
    assert all(type(a) is type(b) for a, b in zip(back, value))
    nan = loads(dumps(float("nan")))
    assert nan != nan
    from collections import Counter, namedtuple
    point = namedtuple("point", "x y")
    assert type(loads(dumps(point(1, 2)))) is tuple and type(loads(dumps(Counter("aab")))) is dict
    for bad in (object(), print, iter([]), (x for x in []), type, [lambda: 1]):
        with pytest.raises(NotPlainData):
            dumps(bad)
    for line in (b'{"t": [1], "s": [2]}', b'{"zz": []}', b'{"s": [[1]]}', b'{"d": [[1]]}',
                 b"[" * 5000 + b"]" * 5000, b"not json", b'{"b": 3}'):
        with pytest.raises(WireError):
            loads(line)


def test_run_tests_verdicts(sandbox_tmp):
    ok = run_tests("def f(x):\n    return x * 2\n", "assert f(21) == 42\n", ["f"], config=FAST)
    assert (ok.status, ok.reason) == ("pass", ""), ok
    r = run_tests("def f(x):\n    return x\n", "assert f(1) == 1\nassert f(2) == 3\n", ["f"], config=FAST)
    assert r.status == "fail" and "test line 2: assert f(2) == 3" in r.reason, r
    # the candidate's exception is re-raised in the harness as the same builtin exception
    catching = "try:\n    f(0)\nexcept ValueError as e:\n    assert 'no zero' in str(e)\nelse:\n    assert False\n"
    r = run_tests("def f(x):\n    raise ValueError('no zero')\n", catching, ["f"], config=FAST)
    assert r.status == "pass", r
    # a broken exchange cannot be swallowed by the tests' own except clauses
    r = run_tests("def f(x):\n    return object()\n", "try:\n    f(0)\nexcept BaseException:\n    pass\n",
                  ["f"], config=FAST)
    assert r.status == "error" and "not plain data" in r.reason, r
    r = run_tests("def f(x):\n    return 1\n", "assert f(lambda: 0) == 1\n", ["f"], config=FAST)
    assert r.status == "error" and "only plain data" in r.reason, r
    r = run_tests("def g(x):\n    return 1\n", "assert f(0) == 1\n", ["f"], config=FAST)
    assert r.status == "error" and "defines no 'f'" in r.reason, r
    r = run_tests("raise KeyError('k')\n", "assert f(0) == 1\n", ["f"], config=FAST)
    assert r.status == "error" and r.reason.startswith("KeyError") and "line 1" in r.reason, r
    r = run_tests("def f(x):\n    return 'y' * (4 << 20)\n", "assert f(0)\n", ["f"], config=FAST)
    assert r.status == "error" and "larger than" in r.reason, r
    r = run_tests("def f(x):\n    print('hello from f')\n    return 1\n", "assert f(0) == 1\n", ["f"], config=FAST)
    assert r.passed and r.stdout == "hello from f", r
    # trusted setup runs in the harness: its helpers are the dataset's, not the candidate's
    r = run_tests("def helper():\n    return 'forged'\ndef f():\n    return 'real'\n",
                  "assert f() == helper()\n", ["f"], setup="def helper():\n    return 'real'\n", config=FAST)
    assert r.passed, r
    still_works()


def test_run_tests_limits(sandbox_tmp):
    r = run_tests("def f():\n    while True:\n        pass\n", "f()\n", ["f"], config=SandboxConfig(timeout_s=0.5))
    assert r.status == "timeout", r
    r = run_tests("import time\ndef f():\n    time.sleep(60)\n", "f()\n", ["f"], config=SandboxConfig(timeout_s=0.5))
    assert r.status == "timeout", r
    r = run_tests("def f():\n    return bytearray(8 << 30)\n", "f()\n", ["f"], config=FAST)
    assert r.status == "error" and "MemoryError" in r.reason, r
    r = run_tests("def f(n):\n    return f(n + 1)\n", "f(0)\n", ["f"], config=FAST)
    assert r.status == "error" and "RecursionError" in r.reason, r
    r = run_tests("import os\ndef f():\n    os._exit(0)\n", "assert f() is None\n", ["f"], config=FAST)
    assert r.status == "error" and "process ended" in r.reason, r
    still_works()


@pytest.mark.skipif(not (landlock_abi() or read_only_mounts_available()),
                    reason="neither Landlock nor read-only mounts on this machine (isolation='none')")
def test_kernel_confines_writes_without_the_prelude(sandbox_tmp, tmp_path):
    """With the prelude off, the kernel alone keeps writes in the working directory."""
    target = tmp_path / "outside.txt"
    bare = SandboxConfig(timeout_s=2, prelude=False)
    for src in (f"open({str(target)!r}, 'w').write('x')\n",
                f"import os\nfd = os.open({str(tmp_path)!r}, os.O_RDONLY)\n"
                "os.close(os.open('outside.txt', os.O_CREAT | os.O_WRONLY, dir_fd=fd))\n",
                f"import os\nos.symlink({str(target)!r}, 'link')\nopen('link', 'w').write('x')\n"):
        r = run_program(src, bare)
        assert r.status == "error" and ("Permission" in r.reason or "Read-only" in r.reason), r
        assert r.isolation != "none" and not target.exists()
    r = run_program("open('inside.txt', 'w').write('x')\nimport os\nos.rename('inside.txt', 'b')\n", bare)
    assert r.status == "pass", r
    still_works()


def test_no_capabilities_even_as_root(sandbox_tmp):
    """Root in the child keeps its uid but loses every capability (no mount, no clock, no
    sethostname on the host's UTS namespace) and cannot regain any through exec."""
    src = ("status = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)\n"
           "assert int(status['CapEff'], 16) == 0 and int(status['CapPrm'], 16) == 0, status\n"
           "assert status['NoNewPrivs'].strip() == '1'\n"
           "import socket\ntry:\n    socket.sethostname(socket.gethostname())\nexcept PermissionError:\n    pass\n"
           "else:\n    raise AssertionError('sethostname worked')\n")
    r = run_program(src, FAST)
    assert r.status == "pass", r
