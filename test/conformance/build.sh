#!/usr/bin/env bash
# Builds what make conformance runs beyond the Kubernetes binaries of
# test/e2e/build-binaries.sh, into the same cache, keyed by version:
#
#   $EBPF_PROXY_CACHE/k8s-conformance/<kubernetes version>/e2e-network.test
#       Kubernetes' e2e suite cut down to [sig-network]
#       (test/e2e/tools/network, go test -c)
#   $EBPF_PROXY_CACHE/k8s-conformance/<kubernetes version>/agnhost
#       the suite's test server (k8s.io/kubernetes/test/images/agnhost)
#   $EBPF_PROXY_CACHE/k8s-conformance/<kubernetes version>/regression-issue-74839
#       the server of the Conntrack spec of invalid packets (its own marker,
#       .complete-regression: added after the others, it builds alone)
#   $EBPF_PROXY_CACHE/coredns/<coredns version>/coredns
#       the cluster's DNS (test/conformance/coredns, its own module)
#
# The Kubernetes versions come from test/e2e/tools/go.mod, CoreDNS's from
# test/conformance/coredns/go.mod. A directory whose .complete marker
# (written last) names the same inputs is left alone: a cold build takes
# about 15 minutes on two cores (the suite about 5 with the Kubernetes
# binaries' build cache warm, agnhost 4, CoreDNS 10). The inputs are the
# version, the module's go.mod and go.sum and, for the suite, its source:
# an edit to test/e2e/tools/network rebuilds the suite alone.
#
# The lock is build-binaries.sh's: the two never build at once on this
# machine's two cores.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
tools=$repo/test/e2e/tools
dns=$here/coredns
cache=${EBPF_PROXY_CACHE:-/var/cache/ebpf-proxy}

# mod_version and k8s_ldflags (k8s_ldflags gives the suite its version:
# it prints it, and kubectl's skew checks read it, as build-binaries.sh
# gives it to the other Kubernetes binaries; run it in the tools module).
. "$repo/test/e2e/k8s-build.sh"

k8s_version=$(mod_version k8s.io/kubernetes "$tools/go.mod")
dns_version=$(mod_version github.com/coredns/coredns "$dns/go.mod")
k8s_dir=$cache/k8s-conformance/$k8s_version
dns_dir=$cache/coredns/$dns_version

# inputs NAME FILE... prints a line naming the hash of the files, the
# marker's record of what a binary was built from.
inputs() {
	local name=$1
	shift
	echo "$name=$(cat "$@" | sha256sum | cut -c1-16)"
}
suite_inputs=$(inputs e2e-network.test "$tools/go.mod" "$tools/go.sum" "$tools"/network/*.go)
agnhost_inputs=$(inputs agnhost "$tools/go.mod" "$tools/go.sum")
dns_inputs=$(inputs coredns "$dns/go.mod" "$dns/go.sum")
regression_inputs=$(inputs regression-issue-74839 "$tools/go.mod" "$tools/go.sum")

# up_to_date DIR LINE... says whether DIR's marker holds every LINE.
up_to_date() {
	local dir=$1 l
	shift
	[[ -f $dir/.complete ]] || return 1
	for l in "$@"; do
		grep -qxF "$l" "$dir/.complete" || return 1
	done
}

# regression_up_to_date says whether the Conntrack spec's server is built
# from the same inputs.
regression_up_to_date() {
	[[ -f $k8s_dir/.complete-regression ]] && grep -qxF "$regression_inputs" "$k8s_dir/.complete-regression"
}

if up_to_date "$k8s_dir" "$suite_inputs" "$agnhost_inputs" && up_to_date "$dns_dir" "$dns_inputs" && regression_up_to_date; then
	echo "conformance/build.sh: $k8s_dir and $dns_dir are up to date"
	exit 0
fi

mkdir -p "$cache"
exec 9>"$cache/.build.lock"
flock 9

export CGO_ENABLED=0 GOWORK=off GOFLAGS="${GOFLAGS:-} -mod=readonly"


# finish DIR LINE... records what DIR's binaries were built from, last.
finish() {
	local dir=$1
	shift
	{
		printf '%s\n' "$@"
		echo "go=$(go env GOVERSION)"
	} >"$dir/.complete.tmp"
	mv -f "$dir/.complete.tmp" "$dir/.complete"
}

if ! up_to_date "$k8s_dir" "$suite_inputs" "$agnhost_inputs"; then
	mkdir -p "$k8s_dir"
	rm -f "$k8s_dir/.complete"
	ldflags=$(cd "$tools" && k8s_ldflags)
	start=$SECONDS
	echo "conformance/build.sh: building the [sig-network] e2e suite $k8s_version"
	# -trimpath and the ldflags as build-binaries.sh: the packages it
	# compiled for the Kubernetes binaries come from the build cache.
	(cd "$tools" && nice -n 10 go test -c -trimpath -ldflags "$ldflags" -o "$k8s_dir/e2e-network.test.tmp" ./network)
	mv -f "$k8s_dir/e2e-network.test.tmp" "$k8s_dir/e2e-network.test"
	echo "conformance/build.sh: the suite in $((SECONDS - start))s"
	start=$SECONDS
	echo "conformance/build.sh: building agnhost $k8s_version"
	(cd "$tools" && nice -n 10 go build -trimpath -ldflags "-s -w" -o "$k8s_dir/agnhost.tmp" k8s.io/kubernetes/test/images/agnhost)
	mv -f "$k8s_dir/agnhost.tmp" "$k8s_dir/agnhost"
	echo "conformance/build.sh: agnhost in $((SECONDS - start))s"
	finish "$k8s_dir" "version=$k8s_version" "$suite_inputs" "$agnhost_inputs"
fi

if ! regression_up_to_date; then
	mkdir -p "$k8s_dir"
	start=$SECONDS
	echo "conformance/build.sh: building regression-issue-74839 $k8s_version"
	(cd "$tools" && nice -n 10 go build -trimpath -ldflags "-s -w" -o "$k8s_dir/regression-issue-74839.tmp" k8s.io/kubernetes/test/images/regression-issue-74839)
	mv -f "$k8s_dir/regression-issue-74839.tmp" "$k8s_dir/regression-issue-74839"
	echo "conformance/build.sh: regression-issue-74839 in $((SECONDS - start))s"
	echo "$regression_inputs" >"$k8s_dir/.complete-regression"
fi

if ! up_to_date "$dns_dir" "$dns_inputs"; then
	mkdir -p "$dns_dir"
	rm -f "$dns_dir/.complete"
	start=$SECONDS
	echo "conformance/build.sh: building CoreDNS $dns_version"
	(cd "$dns" && nice -n 10 go build -trimpath -ldflags "-s -w" -o "$dns_dir/coredns.tmp" github.com/coredns/coredns)
	mv -f "$dns_dir/coredns.tmp" "$dns_dir/coredns"
	echo "conformance/build.sh: CoreDNS in $((SECONDS - start))s"
	finish "$dns_dir" "version=$dns_version" "$dns_inputs"
fi
