#!/usr/bin/env bash
# Builds the pinned etcd, kube-apiserver, kube-proxy and kubectl that the
# end-to-end tests run, into a cache directory keyed by version:
#
#   $EBPF_PROXY_CACHE/etcd/<etcd version>/etcd
#   $EBPF_PROXY_CACHE/k8s/<kubernetes version>/{kube-apiserver,kube-proxy,kubectl}
#
# With the argument "node" it also builds what a real node runs (the cluster
# test in the VM, test/cluster), into
#
#   $EBPF_PROXY_CACHE/k8s-node/<kubernetes version>/{kubelet,kube-controller-manager,kube-scheduler}
#
# EBPF_PROXY_CACHE defaults to /var/cache/ebpf-proxy. A cold build takes about
# eight minutes on two cores, so a directory that already holds a completed
# build (its .complete marker, written last) is left alone: CI on the same
# machine builds once. Versions come from tools/go.mod (see tools/gen-gomod.sh).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
tools=$here/tools
cache=${EBPF_PROXY_CACHE:-/var/cache/ebpf-proxy}

# mod_version and k8s_ldflags.
. "$here/k8s-build.sh"

k8s_version=$(mod_version k8s.io/kubernetes "$tools/go.mod")
etcd_version=$(mod_version go.etcd.io/etcd/server/v3 "$tools/go.mod")
k8s_dir=$cache/k8s/$k8s_version
etcd_dir=$cache/etcd/$etcd_version
node_dir=
case ${1:-} in
"") ;;
node) node_dir=$cache/k8s-node/$k8s_version ;;
*) echo "build-binaries.sh: unknown argument $1 (only \"node\")" >&2; exit 2 ;;
esac

complete() { [[ -f $1/.complete ]]; }

if complete "$k8s_dir" && complete "$etcd_dir" && { [[ -z $node_dir ]] || complete "$node_dir"; }; then
	echo "build-binaries.sh: $etcd_dir and $k8s_dir${node_dir:+ and $node_dir} are up to date"
	exit 0
fi

mkdir -p "$cache"
# Two make runs at once (a developer and CI on one machine) would otherwise
# both spend eight minutes building and race on the same files.
exec 9>"$cache/.build.lock"
flock 9

export CGO_ENABLED=0 GOWORK=off GOFLAGS="${GOFLAGS:-} -mod=readonly"
cd "$tools"

# Builds packages into a temporary directory next to the final one, moves the
# binaries into place and writes the marker last, so an interrupted build is
# redone instead of being mistaken for a complete one.
build() {
	local dir=$1 version=$2 ldflags=$3
	shift 3
	local tmp start
	tmp=$(mktemp -d "$dir.tmp.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	start=$SECONDS
	local args=()
	while (($#)); do
		args+=("$1:$2")
		shift 2
	done
	for a in "${args[@]}"; do
		echo "build-binaries.sh: building ${a%%:*} $version"
		nice -n 10 go build -trimpath -ldflags "$ldflags" -o "$tmp/${a%%:*}" "${a#*:}"
	done
	for a in "${args[@]}"; do
		mv -f "$tmp/${a%%:*}" "$dir/${a%%:*}"
	done
	{
		echo "version=$version"
		echo "go=$(go env GOVERSION)"
		(cd "$dir" && sha256sum "${args[@]%%:*}")
	} > "$dir/.complete.tmp"
	mv -f "$dir/.complete.tmp" "$dir/.complete"
	rm -rf "$tmp"
	trap - EXIT
	echo "build-binaries.sh: $dir done in $((SECONDS - start))s"
}

if ! complete "$etcd_dir"; then
	mkdir -p "$etcd_dir"
	# The etcd server's main package is its module root.
	build "$etcd_dir" "$etcd_version" "-s -w" etcd go.etcd.io/etcd/server/v3
fi


if ! complete "$k8s_dir"; then
	mkdir -p "$k8s_dir"
	build "$k8s_dir" "$k8s_version" "$(k8s_ldflags)" \
		kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver \
		kube-proxy k8s.io/kubernetes/cmd/kube-proxy \
		kubectl k8s.io/kubernetes/cmd/kubectl
fi

if [[ -n $node_dir ]] && ! complete "$node_dir"; then
	mkdir -p "$node_dir"
	build "$node_dir" "$k8s_version" "$(k8s_ldflags)" \
		kubelet k8s.io/kubernetes/cmd/kubelet \
		kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager \
		kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler
fi
