#!/bin/busybox sh
# Stage one of a vmtest guest, run by the kernel from the initramfs.
# It loads the few modules needed to reach the host's root over 9p, stacks a
# tmpfs overlay on it so that the guest can write anywhere without touching the
# host, mounts the run's read-write share at the same path as on the host, and
# hands over to the guest agent (stage two, Go) in the new root.
# Markers on the console tell the host how far the boot got.

/bin/busybox mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
/bin/busybox --install -s /bin
export PATH=/bin

fail() {
	echo "vmtest-stage1: error: $*"
	poweroff -f
	sleep 60
}

mount -t proc proc /proc || fail "mount /proc"
mount -t sysfs sysfs /sys || fail "mount /sys"

run=
for word in $(cat /proc/cmdline); do
	case "$word" in
	vmtest.run=*) run=${word#vmtest.run=} ;;
	esac
done
[ -n "$run" ] || fail "no vmtest.run= on the kernel command line"

for m in /lib/modules/*.ko; do
	insmod "$m" || fail "insmod $m"
done

opts=trans=virtio,version=9p2000.L,msize=262144
mount -t 9p -o "$opts,ro,cache=loose" root /lower || fail "mount the host root over 9p"
mount -t tmpfs -o mode=0755 tmpfs /rw || fail "mount tmpfs for the overlay"
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot ||
	fail "mount the overlay root"
mkdir -p "/newroot$run"
mount -t 9p -o "$opts" run "/newroot$run" || fail "mount the run share at $run"
for d in dev proc sys; do
	mount --move "/$d" "/newroot/$d" || fail "move /$d"
done

echo "vmtest-stage1: ok"
exec switch_root /newroot "$run/vmtest-guest" guest "$run/spec.json"
