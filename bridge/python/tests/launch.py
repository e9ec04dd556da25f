"""Start N ranks of a worker script as fresh interpreters (never fork after
loading libgocoll) with a launcher-like environment, wait with a deadline,
and kill whatever is left — used by the tests and the benchmark."""

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
BRIDGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # bridge/python
WORKERS = os.path.join(BRIDGE, "tests", "workers")


def _ephemeral_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(v) for v in f.read().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(port):
    with socket.socket() as s:
        try:
            s.bind(("", port))
            return True
        except OSError:
            return False


def free_port_pair():
    """A port p such that p and p+1 are free now (torchrun's store takes
    MASTER_PORT, gocoll's rendezvous MASTER_PORT+1). Chosen outside the
    kernel's ephemeral range, so that no outgoing connection (of this job or
    of anything else on the machine) is handed the port before the job binds it."""
    lo, hi = _ephemeral_range()
    candidates = [(1024, lo - 1), (hi + 1, 65534)]
    candidates = [(a, b) for a, b in candidates if b - a > 100] or [(lo, hi - 1)]
    for _ in range(200):
        a, b = random.choice(candidates)
        p = random.randrange(max(a, 10000) if b > 10100 else a, b)
        if _bindable(p) and _bindable(p + 1):
            return p
    raise RuntimeError("no free port pair")


class RankResult:
    def __init__(self, rank, rc, stdout, stderr):
        self.rank, self.rc, self.stdout, self.stderr = rank, rc, stdout, stderr

    @property
    def result(self):
        """The JSON object the worker printed on a line starting 'RESULT '."""
        for line in reversed(self.stdout.splitlines()):
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT "):])
        return None

    def __repr__(self):
        return "<rank %d rc=%s>\n--- stdout ---\n%s\n--- stderr ---\n%s" % (
            self.rank, self.rc, self.stdout[-4000:], self.stderr[-4000:])


class RanksFailed(AssertionError):
    pass


def run_ranks(script, nranks, args=(), env=None, timeout=90, check=True, per_rank_env=None,
              python=PYTHON, cmd=None):
    """Run ``script`` (a path, or a name in tests/workers/) as ``nranks``
    processes with RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT set
    (or the program ``cmd``, a list, instead of a Python script).
    Returns a list of RankResult; with ``check``, raises RanksFailed (with
    every rank's output) when a rank failed or the deadline passed."""
    if cmd is None and not os.path.isabs(script):
        script = os.path.join(WORKERS, script)
    argv = list(cmd) if cmd is not None else [python, script]
    argv += [str(a) for a in args]
    port = free_port_pair()
    base = dict(os.environ)
    base.update({
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(nranks),
        "LOCAL_WORLD_SIZE": str(nranks),
        "PYTHONPATH": BRIDGE + os.pathsep + base.get("PYTHONPATH", ""),
        "OMP_NUM_THREADS": "1",
        "GOCOLL_TIMEOUT": base.get("GOCOLL_TIMEOUT", "60s"),
        "PYTHONUNBUFFERED": "1",
    })
    if env:
        base.update(env)
    procs, files = [], []
    try:
        for r in range(nranks):
            e = dict(base, RANK=str(r), LOCAL_RANK=str(r))
            if per_rank_env:  # a value of None removes the variable
                for k, v in per_rank_env(r).items():
                    if v is None:
                        e.pop(k, None)
                    else:
                        e[k] = v
            out = tempfile.TemporaryFile(mode="w+")
            err = tempfile.TemporaryFile(mode="w+")
            files.append((out, err))
            procs.append(subprocess.Popen(argv, env=e,
                                          stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                          start_new_session=True, cwd=BRIDGE))
        deadline = time.monotonic() + timeout
        timed_out = False
        for p in procs:
            left = deadline - time.monotonic()
            try:
                p.wait(timeout=max(left, 0.1))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
    finally:
        for p in procs:
            if p.poll() is None:
                _kill(p)
    results = []
    for r, (p, (out, err)) in enumerate(zip(procs, files)):
        out.seek(0)
        err.seek(0)
        results.append(RankResult(r, p.returncode, out.read(), err.read()))
        out.close()
        err.close()
    if check and (timed_out or any(x.rc != 0 for x in results)):
        why = "timed out after %ss" % timeout if timed_out else "a rank failed"
        raise RanksFailed("%s %d ranks: %s\n%s" % (os.path.basename(argv[1 if cmd is None else 0]), nranks, why,
                                                   "\n".join(map(repr, results))))
    return results


def _kill(p):
    """Kill a process we started and its session (its own process group)."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def run_cmd(argv, timeout, env=None, cwd=BRIDGE):
    """subprocess.run for one program in its own session; on timeout the
    whole session (it and anything it started) is killed. Returns
    (returncode, stdout, stderr); returncode is None after a timeout."""
    p = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = p.communicate()
        return None, out, err + "\n[killed after %ss]" % timeout


@contextlib.contextmanager
def private_shm():
    """A /dev/shm of their own for the ranks of a job, all the same one: a
    tmpfs mounted on a temporary directory, bound over /dev/shm in a mount
    namespace of each rank. Yields the command prefix that starts a program
    that way (put it before the program in run_ranks' ``cmd``), or None
    without root or unshare. What a job leaves there is then exactly what
    it made, whatever else runs on the machine."""
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("unshare", "mount", "umount")):
        yield None
        return
    d = tempfile.mkdtemp(prefix="gocoll-shm-")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m,mode=1777", "tmpfs", d],
                      capture_output=True).returncode != 0:
        os.rmdir(d)
        yield None
        return
    try:
        ok = subprocess.run(["unshare", "--mount", "sh", "-c", 'mount --bind "$0" /dev/shm', d],
                            capture_output=True).returncode == 0
        yield ["unshare", "--mount", "sh", "-c", 'mount --bind "$0" /dev/shm && exec "$@"', d] if ok else None
    finally:
        subprocess.run(["umount", d], capture_output=True)
        os.rmdir(d)
