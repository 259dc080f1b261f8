package main

import (
	"log"
	"os"
	"os/signal"
	"syscall"
)

// Pause does what the Kubernetes pause container does: nothing, until
// SIGINT or SIGTERM, while reaping the zombies a pod's sandbox collects as
// its PID 1 (processes of a shared PID namespace whose parents died).
func Pause() {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	defer signal.Stop(sigs)
	reap()
	for s := range sigs {
		if s == syscall.SIGCHLD {
			reap()
			continue
		}
		log.Printf("pause: %v, exiting", s)
		return
	}
}

// reap waits for every child that has exited, without blocking. SIGCHLD is
// not queued, so one signal may stand for many children.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}
