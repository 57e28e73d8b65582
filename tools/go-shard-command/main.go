// A shard COMMAND as Go programs are written: it catches SIGHUP and SIGTERM in order to exit
// (as most Go and JVM services do), so its /proc status shows SIGHUP caught although a change
// signal would end it. The e2e tests run it under `kube-leader run --shards`.
//
// It appends "start <unix ns> <KUBE_LEADER_SHARD_SET>" to $LOG_FILE when it starts and
// "exit <unix ns> <signal>" when a signal ends it.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func record(line string) {
	f, err := os.OpenFile(os.Getenv("LOG_FILE"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Fprintln(f, line)
	f.Close()
}

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGHUP, syscall.SIGTERM)
	record(fmt.Sprintf("start %d %s", time.Now().UnixNano(), os.Getenv("KUBE_LEADER_SHARD_SET")))
	sig := <-stop
	record(fmt.Sprintf("exit %d %s", time.Now().UnixNano(), sig))
	os.Exit(0)
}
