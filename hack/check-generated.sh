#!/bin/sh
# Regenerates the BPF objects and Go bindings into a temporary copy of the
# tracked sources and fails if they differ from the committed ones: the
# committed output must be exactly what the pinned clang makes of the C.
set -eu
top=$(git rev-parse --show-toplevel)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$top"
git ls-files -z | xargs -0 cp --parents -t "$tmp"
make -C "$tmp" --no-print-directory generate >/dev/null
status=0
for dir in internal/bpfobj internal/testing/pktest/sample; do
	if ! diff -r "$top/$dir" "$tmp/$dir"; then
		echo "generated files in $dir differ from the committed ones: run 'make generate' and commit" >&2
		status=1
	fi
done
[ "$status" -eq 0 ] || exit 1
echo "generated BPF objects match the committed ones"
