#!/usr/bin/env python3
"""The suite's runner: `make test` and `make test-soak` both run the test binaries through it.

`cargo test --all-targets` runs its ~55 test binaries one after another, and most of the suite's
time is real-process tests waiting on real time (report intervals, lease expiry, a minute edge):
13 minutes from a fresh clone, 9 of them in tests that keep the two cores mostly idle. This
script builds the binaries once (`cargo test --no-run`), then runs them itself, JOBS at a time:
the deadline tests with nothing beside them (EXCLUSIVE), those whose tests hold real processes
to the product's timing (ALONE) one after another, each beside binaries that mostly wait (QUIET)
and nothing busier, the rest after them, the slowest first (SLOWEST_FIRST); and it prints each binary's wall and CPU time, every failing
binary's whole output, and the slowest binaries: the suite's time budget, on every run.

Running binaries side by side is safe because each test owns what it touches: free loopback
ports (the Redis and Envoy harnesses check that the server answering is the one they started),
temp directories and key prefixes of their own, and no test binary reads another's state.
Within a binary, libtest runs the tests on its default threads, as `cargo test` does.

    python3 scripts/test_run.py                    # the whole suite (make test)
    python3 scripts/test_run.py deadlines rlqs     # some binaries (file stems of tests/*.rs)
    RUNS=10 HOG=1 python3 scripts/test_run.py deadlines   # make test-soak: 10 runs beside a hog

JOBS (3): binaries at a time. RUNS (1): runs of the whole selection, one after another.
HOG (0): 1 keeps every core busy with a busy loop at `nice 10` meanwhile (a busy machine: a
nice-19 loop is too gentle to show anything, one at nice 0 would starve the 20 ms deadline tests
outright). TIMEOUT (900): seconds a binary may run before it is killed and counted as hung.
Exits 1 when any test failed in any run. Failing runs' output stays in target/test-runs/.
"""

import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "target", "test-runs")

# Started first, longest first, so no long binary starts last and runs alone (seconds on this
# 2-core machine, quiet, one binary at a time). Every other binary follows in name order.
SLOWEST_FIRST = [
    "rlqs",  # 125 s: report intervals, an outage of several intervals, a silent stream ended
    "regions",  # 66 s: heartbeats, exchanges and a partition on real time
    "memory_flood",  # 30-60 s, CPU-bound
    "refund_bounds",  # up to 60 s: waits for a real minute's edge
    "deadlines",  # 39 s
    "lease_exactness",  # 33 s
    "burst_exactness",  # 24 s
    "store_contract",  # 20 s
    "hot_keys",  # 20 s
    "sentinel",  # 19 s
    "store_wait",  # 16 s
    "concurrency",  # 15 s
    "cluster_failover",  # 15 s
]

# Binaries whose tests hold real processes to the product's timing at its defaults: Envoy's
# 20 ms deadline, the 10 ms store timeout under a burst, a p99 while a peer attacks, a breaker
# opening at the simulator's moment, a region's decisions not waiting on a global store 60 ms
# away. Each runs with no other busy binary beside it (only QUIET ones), as `cargo test` ran
# every binary: a busy loop at nice 10 leaves them their CPU, two other test binaries at their
# own priority do not (measured: beside a second suite, 3 of 11 burst_exactness tests saw the
# store silent for 10 ms, breaker_parity's real breaker opened 118 ms late).
ALONE = [
    "burst_exactness",
    "regions",
    "hostile_peers",
    "breaker_parity",
    "replica_kill",
    "concurrency",
    "cluster_failover",
    "slow_network",
]

# Binaries that mostly wait on real time (report intervals, expiries, a minute's edge): CPU
# under a sixth of their wall time, measured by this runner's CPU column. They run beside
# anything, an ALONE binary included.
QUIET = [
    "rlqs",
    "lease_exactness",
    "refund_bounds",
    "store_wait",
    "usage_costs",
    "drop_in",
    "faults",
    "first_day",
    "fallback",
    "counter_api",
    "cli",
    "cluster",
    "rules_edit",
    "rules_xds",
    "envoy_gateway",
    "otlp",
    "self_protection",
    "shared_quota",
    "store_batch",
    "dashboard_metrics",
    "credentials",
    "examples",
    "tollgate-bin",
]


# Run with nothing else at all (first, before anything starts): the deadline tests answer
# within Envoy's 20 ms less `decision_margin_ms` (5 ms), so a 5 ms scheduling pause of their
# process fails a call whatever tollgate does. Beside a busy loop at nice 10 they pass (3 runs
# of 3, and 10 of 10); beside even the QUIET binaries' bursts, 3 whole-suite runs of 3 failed
# 1-4 % of their calls.
EXCLUSIVE = ["deadlines"]


def may_start(name, running):
    """Whether `name` may start beside the binaries `running`: an EXCLUSIVE binary only when
    nothing runs, and nothing beside it; an ALONE binary only beside QUIET ones; any other busy
    binary only while no ALONE one runs; a QUIET one always (but beside no EXCLUSIVE one)."""
    running = list(running)
    if name in EXCLUSIVE:
        return not running
    if any(r in EXCLUSIVE for r in running):
        return False
    if name in QUIET:
        return True
    if name in ALONE:
        return all(r in QUIET for r in running)
    return not any(r in ALONE for r in running)


def build(selection):
    """Builds the test binaries and returns {name: executable}. `tollgate` is the library's unit
    tests (the binary target's tests are named `tollgate-bin`)."""
    args = [os.environ.get("CARGO", "cargo"), "test", "--no-run", "--message-format=json-render-diagnostics"]
    if selection:
        for name in selection:
            args += ["--lib"] if name == "tollgate" else ["--test", name]
    else:
        args.append("--all-targets")
    proc = subprocess.run(args, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"test-run: the build failed (cargo exited {proc.returncode})")
    found = {}
    for line in proc.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg["profile"]["test"]:
            continue
        target = msg["target"]
        name = target["name"]
        if "bin" in target["kind"]:
            name += "-bin"
        if name in found:
            sys.exit(f"test-run: two test binaries are named {name}")
        found[name] = msg["executable"]
    missing = [n for n in selection if n not in found]
    if not found or missing:
        sys.exit(f"test-run: cargo built no test binary named {missing or 'anything'}")
    return found


def order(names):
    """The queue: the EXCLUSIVE ones (with nothing beside them), the long QUIET ones (they
    overlap everything after), the ALONE ones (one after another, beside QUIET ones only), then
    the rest, slowest first."""
    slow = [n for n in SLOWEST_FIRST if n in names]
    rest = slow + sorted(n for n in names if n not in slow)
    exclusive = [n for n in rest if n in EXCLUSIVE]
    quiet_first = [n for n in rest if n in QUIET][:2]
    alone = [n for n in rest if n in ALONE and n not in exclusive]
    first = exclusive + quiet_first + alone
    return first + [n for n in rest if n not in first]


def run_one(name, exe, run, timeout):
    """Runs one binary from the package root (where `cargo test` runs it) and returns
    (name, ok, wall s, CPU s, summary line, failing tests, log path). The CPU is the binary's
    own plus that of the servers it started and reaped (os.wait4's rusage)."""
    os.makedirs(OUT, exist_ok=True)
    log_path = os.path.join(OUT, f"{name}.{run}.log")
    start = time.monotonic()
    with open(log_path, "w") as log:
        # Its own process group: a hung binary is killed with the servers it started, and a
        # server a failed test left behind is killed once the binary is done.
        child = subprocess.Popen(
            [exe], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        LIVE.add(child.pid)
        hung = False
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - start > timeout:
                hung = True
                os.killpg(child.pid, signal.SIGKILL)
                pid, status, usage = os.wait4(child.pid, 0)
                break
            time.sleep(0.05)
        child.returncode = os.waitstatus_to_exitcode(status)
        LIVE.discard(child.pid)
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wall = time.monotonic() - start
    cpu = usage.ru_utime + usage.ru_stime
    with open(log_path, errors="replace") as f:
        text = f.read()
    failing = failed_tests(text)
    results = [line for line in text.splitlines() if line.startswith("test result:")]
    summary = results[-1] if results else "(no test result line)"
    ok = child.returncode == 0 and not hung
    if hung:
        failing.append(f"(hung: killed after {timeout} s)")
    elif not ok and not failing:
        failing.append(f"(the binary exited {child.returncode} without a failing test)")
    if ok:
        os.remove(log_path)
    return name, ok, wall, cpu, summary, failing, log_path


# The process groups of the binaries running now, and the hog's loops: killed on Ctrl-C or
# SIGTERM, so an interrupted run leaves no test, server or busy loop behind.
LIVE = set()
HOGS = []


def stop_everything(signum, _frame):
    kill_live()
    for h in HOGS:
        h.kill()
    print(f"test-run: interrupted (signal {signum}); the running binaries were killed", flush=True)
    os._exit(128 + signum)


def run_all(names, jobs, binaries, run, timeout):
    """Runs `names` at most `jobs` at a time, starting each as soon as [`may_start`] lets it (in
    queue order, the first that may); yields each result as its binary finishes."""
    queue = list(names)
    running = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        while queue or running:
            started = True
            while started and len(running) < jobs:
                started = False
                for name in queue:
                    if may_start(name, running.values()):
                        queue.remove(name)
                        fut = pool.submit(run_one, name, binaries[name], run, timeout)
                        running[fut] = name
                        started = True
                        break
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in done:
                del running[fut]
                yield fut.result()


def failed_tests(text):
    """The failing tests' names from libtest's closing list (`failures:` then one indented name a
    line): a test's own output can break its `test … FAILED` line in two."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line == "failures:"]
    if not starts:
        return []
    names = []
    for line in lines[starts[-1] + 1 :]:
        if not line.startswith("    "):
            break
        names.append(line.strip())
    return names


def kill_live():
    for pid in list(LIVE):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start_hog():
    if os.environ.get("HOG", "0") != "1":
        return []
    hogs = [
        subprocess.Popen(["nice", "-n", "10", "bash", "-c", "while :; do :; done"])
        for _ in range(len(os.sched_getaffinity(0)))
    ]
    HOGS.extend(hogs)
    print(f"test-run: {len(hogs)} busy loops at nice 10 (HOG=1)", flush=True)
    return hogs


def main():
    selection = sys.argv[1:]
    jobs = int(os.environ.get("JOBS", "3"))
    runs = int(os.environ.get("RUNS", "1"))
    timeout = int(os.environ.get("TIMEOUT", "900"))
    signal.signal(signal.SIGINT, stop_everything)
    signal.signal(signal.SIGTERM, stop_everything)
    binaries = build(selection)
    names = order(list(binaries))
    hogs = start_hog()
    walls = defaultdict(list)
    cpus = defaultdict(list)
    failures = defaultdict(lambda: defaultdict(int))
    failed_runs = defaultdict(int)
    failed_any = False
    suite_walls = []
    try:
        for run in range(1, runs + 1):
            started = time.monotonic()
            for result in run_all(names, jobs, binaries, run, timeout):
                name, ok, wall, cpu, summary, failing, log_path = result
                walls[name].append(wall)
                cpus[name].append(cpu)
                mark = "ok  " if ok else "FAIL"
                print(f"{mark} {name:<20} {wall:6.1f} s wall {cpu:6.1f} s CPU  {summary}", flush=True)
                if not ok:
                    failed_any = True
                    failed_runs[name] += 1
                    for test in failing:
                        failures[name][test] += 1
                    with open(log_path, errors="replace") as f:
                        print(f"---- {name}: output ({log_path}) ----\n{f.read()}---- end of {name} ----")
            suite_walls.append(time.monotonic() - started)
            if runs > 1:
                print(f"test-run: run {run} of {runs} took {suite_walls[-1]:.0f} s", flush=True)
    finally:
        # After an error in this script too: no binary, server or busy loop is left behind.
        kill_live()
        for h in hogs:
            h.kill()
    report(names, walls, cpus, failures, failed_runs, runs, suite_walls, jobs)
    sys.exit(1 if failed_any else 0)


def report(names, walls, cpus, failures, failed_runs, runs, suite_walls, jobs):
    if runs == 1:
        slow = sorted(names, key=lambda n: -walls[n][0])[:10]
        print(f"\ntest-run: {len(names)} binaries, {jobs} at a time, in {suite_walls[0]:.0f} s; the slowest:")
        for n in slow:
            print(f"  {n:<20} {walls[n][0]:6.1f} s wall {cpus[n][0]:6.1f} s CPU")
    else:
        print(f"\ntest-run: {runs} runs, {jobs} binaries at a time; a run took "
              f"{min(suite_walls):.0f}-{max(suite_walls):.0f} s")
        print(f"{'binary':<20} {'runs':>4} {'failed':>6} {'min s':>7} {'med s':>7} {'max s':>7} {'CPU s':>6}  failing tests")
        for n in names:
            w = sorted(walls[n])
            fails = failures.get(n, {})
            nfail = failed_runs[n]
            desc = ", ".join(f"{t} ×{c}" for t, c in sorted(fails.items())) or "none"
            print(f"{n:<20} {runs:>4} {nfail:>6} {w[0]:7.1f} {w[len(w) // 2]:7.1f} {w[-1]:7.1f} "
                  f"{sorted(cpus[n])[len(w) // 2]:6.1f}  {desc}")
    total_fail = sum(sum(f.values()) for f in failures.values())
    print(f"test-run: {'no failures' if total_fail == 0 else f'{total_fail} test failures'}")


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    main()
