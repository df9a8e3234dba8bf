#!/usr/bin/env bash
# Make .venv with Keel and its test tools. torch is pinned to the local CPU build first:
# any looser requirement would pull gigabytes of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# Idempotent: quick when everything is already installed.
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test,bench]"
# iproute2 gives the chaos harness its network namespaces (root only; skipped otherwise).
if ! command -v ip >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  (apt-get update -qq && apt-get install -y -qq iproute2) >/dev/null 2>&1 || echo "iproute2 not installed: netns tests will be skipped"
fi
