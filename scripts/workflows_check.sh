#!/usr/bin/env bash
# `make test`: the GitHub Actions workflows, offline (they only run on GitHub):
# - each file validates against the GitHub workflow schema (check-jsonschema's vendored copy of
#   SchemaStore's github-workflow.json: keys, types, events, job and step shapes);
# - every `uses:` names a version (a tag such as @v4, or a commit SHA), never a branch;
# - every script a workflow runs from this repository exists (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v check-jsonschema >/dev/null || bash scripts/deps.sh
shopt -s nullglob
files=(.github/workflows/*.yml .github/workflows/*.yaml)
[ ${#files[@]} -gt 0 ] || { echo "workflows-check: no workflow files" >&2; exit 1; }
check-jsonschema --builtin-schema vendor.github-workflows "${files[@]}"
python3 - "${files[@]}" <<'PY'
import re, sys, os
bad = []
for path in sys.argv[1:]:
    text = open(path).read()
    for n, line in enumerate(text.splitlines(), 1):
        m = re.match(r"\s*-?\s*uses:\s*([^\s#]+)", line)
        if m and not m.group(1).startswith("./"):
            ref = m.group(1).split("@")
            if len(ref) != 2 or not re.fullmatch(r"v\d+(\.\d+){0,2}|[0-9a-f]{40}", ref[1]):
                bad.append(f"{path}:{n}: {m.group(1)} is not pinned to a version tag or a commit")
    for script in re.findall(r"bash ((?:\.ci|scripts)/[\w./-]+)", text):
        if not os.path.exists(script):
            bad.append(f"{path}: runs {script}, which does not exist")
if bad:
    print("workflows-check: FAILED\n  " + "\n  ".join(bad), file=sys.stderr)
    sys.exit(1)
print(f"workflows-check: ok: {len(sys.argv) - 1} workflow file(s) valid and pinned")
PY
