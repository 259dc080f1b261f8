# Sourced by build-binaries.sh and test/conformance/build.sh.

# mod_version MODULE GOMOD prints the version GOMOD requires of MODULE, in
# a require block or on a require line of its own; it exits naming the
# caller ($0) when there is none.
mod_version() {
	local v
	v=$(awk -v m="$1" '$1 == m && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == m && $3 ~ /^v/ { print $3; exit }' "$2")
	[[ -n $v ]] || { echo "$(basename "$0"): $1 is not required in $2" >&2; exit 1; }
	echo "$v"
}

# k8s_ldflags, with $k8s_version set and the current directory in a module
# that requires k8s.io/kubernetes at that version, prints the flags that give a Kubernetes binary its version.
# Without them every binary reports v0.0.0-master, and kubectl and
# kube-proxy print version-skew warnings. There is no git tree in a module
# zip, which upstream's version.sh calls the "archive" tree state; the
# release time from the module proxy makes the build reproducible.
k8s_ldflags() {
	local info build_date minor ldflags pkg
	go mod download k8s.io/kubernetes >&2
	info="$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$k8s_version.info"
	build_date=$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$info")
	minor=${k8s_version#v1.}
	minor=${minor%%.*}
	ldflags="-s -w"
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
		ldflags+=" -X $pkg.gitTreeState=archive -X $pkg.buildDate=$build_date"
	done
	echo "$ldflags"
}
