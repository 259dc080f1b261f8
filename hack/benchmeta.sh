#!/bin/sh
# benchmeta.sh FILE: records, as a benchmark run ends, when and where it ran,
# for test/benchreport to print beside its figures: the date, the kernel,
# the machine (CPUs, memory, CPU model) and the load average.
set -eu
cpus=$(nproc)
mem=$(awk '/^MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)
model=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
{
	echo "date $(date -u +%Y-%m-%dT%H:%MZ)"
	echo "kernel $(uname -r)"
	echo "machine $cpus CPUs, $mem, ${model:-unknown CPU}"
	echo "loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$1"
