// kube-leader-go-candidate runs client-go's Lease leader election
// (k8s.io/client-go/tools/leaderelection with resourcelock.LeaseLock, i.e.
// coordination.k8s.io/v1 Leases) so kube-leader's integration tests and
// benchmarks can check interoperability with, and compare timings against, the
// reference Go implementation.
//
// It is a Go module of its own (go.mod and go.sum pin k8s.io/client-go,
// k8s.io/api and k8s.io/apimachinery v0.37.2), built static by
// scripts/go-candidate.sh with `go build -mod=readonly -trimpath`; nothing is
// vendored into this repository.
//
// By default it runs the classic LeaseLock election, which acquires an expired
// or released Lease itself. With --coordinated it runs client-go's coordinated
// leader election (KEP-4355; needs the CoordinatedLeaderElection feature gate
// and coordination.k8s.io/v1beta1 on the API server): it registers a
// coordination.k8s.io/v1beta1 LeaseCandidate named after --identity for the
// Lease, in the Lease's namespace (leaderelection.NewCandidate, strategy
// OldestEmulationVersion, --binary-version and --emulation-version), and sets
// LeaderElectionConfig.Coordinated, so it never takes the Lease itself: it
// leads once kube-apiserver's leader election controller names it holder, and
// stops renewing once the Lease names another spec.preferredHolder.
//
// Every event is one JSON line on stdout, written immediately:
//
//	{"event":"started_leading","identity":"a","mono_ns":123,"unix_ns":456}
//	{"event":"new_leader","identity":"a","leader":"b","mono_ns":123,"unix_ns":456}
//	{"event":"stopped_leading","identity":"a","mono_ns":123,"unix_ns":456}
//	{"event":"exit","identity":"a","code":0,"mono_ns":123,"unix_ns":456}
//
// mono_ns is CLOCK_MONOTONIC and unix_ns is wall-clock time, both in
// nanoseconds, read inside the client-go callback. stopped_leading is printed
// only after started_leading, when the context client-go hands to
// OnStartedLeading is cancelled (where code guarded by the lease stops; on a
// signal that is before client-go releases the Lease) or in OnStoppedLeading,
// whichever comes first. While leading the program just waits. SIGTERM or
// SIGINT cancels the election (releasing the Lease if --release-on-cancel) and
// exits 0; losing leadership without a signal exits 3; bad flags or
// configuration exit 2. client-go's own logs (klog) go to stderr.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

const exitLostLeadership = 3

type event struct {
	Event    string `json:"event"`
	Identity string `json:"identity"`
	Leader   string `json:"leader,omitempty"`
	Code     *int   `json:"code,omitempty"`
	MonoNs   int64  `json:"mono_ns"`
	UnixNs   int64  `json:"unix_ns"`
}

var stdoutMu sync.Mutex

func emit(e event) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	e.MonoNs = ts.Nano()
	e.UnixNs = time.Now().UnixNano()
	line, _ := json.Marshal(e)
	stdoutMu.Lock()
	defer stdoutMu.Unlock()
	os.Stdout.Write(append(line, '\n')) // unbuffered: one write per event
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "kube-leader-go-candidate: "+format+"\n", args...)
	os.Exit(2)
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "path to a kubeconfig (empty: in-cluster config)")
	namespace := flag.String("namespace", "default", "namespace of the Lease")
	lease := flag.String("lease", "", "name of the Lease (required)")
	identity := flag.String("identity", "", "holder identity of this candidate (required)")
	leaseDuration := flag.Duration("lease-duration", 15*time.Second, "LeaseDuration")
	renewDeadline := flag.Duration("renew-deadline", 10*time.Second, "RenewDeadline")
	retryPeriod := flag.Duration("retry-period", 2*time.Second, "RetryPeriod")
	releaseOnCancel := flag.Bool("release-on-cancel", true, "release the Lease when cancelled by a signal")
	coordinated := flag.Bool("coordinated", false, "coordinated leader election: register a LeaseCandidate and lead only when the API server's controller names this candidate holder")
	binaryVersion := flag.String("binary-version", "1.37.2", "with --coordinated: the LeaseCandidate's binaryVersion")
	emulationVersion := flag.String("emulation-version", "1.37.2", "with --coordinated: the LeaseCandidate's emulationVersion")
	flag.Parse()
	if flag.NArg() > 0 {
		fail("unexpected arguments: %v", flag.Args())
	}
	if *lease == "" || *identity == "" {
		fail("--lease and --identity are required")
	}

	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail("loading kubeconfig: %v", err)
	}
	config.UserAgent = "kube-leader-go-candidate"
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		fail("creating client: %v", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-signals
		cancel()
	}()

	if *coordinated {
		// The LeaseCandidate is named after the identity: the controller writes the
		// elected candidate's name as the Lease's holderIdentity.
		candidate, _, err := leaderelection.NewCandidate(client, *namespace, *identity, *lease,
			*binaryVersion, *emulationVersion, coordinationv1.OldestEmulationVersion)
		if err != nil {
			fail("creating the LeaseCandidate controller: %v", err)
		}
		go candidate.Run(ctx)
	}

	// client-go starts OnStartedLeading in a goroutine, so it could in principle
	// run after OnStoppedLeading; this keeps the two events paired and ordered.
	var mu sync.Mutex
	var leading, stopped bool
	stop := func() {
		mu.Lock()
		defer mu.Unlock()
		if leading && !stopped {
			emit(event{Event: "stopped_leading", Identity: *identity})
		}
		stopped = true
	}
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: *namespace, Name: *lease},
			Client:     client.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: *identity},
		},
		LeaseDuration:   *leaseDuration,
		RenewDeadline:   *renewDeadline,
		RetryPeriod:     *retryPeriod,
		ReleaseOnCancel: *releaseOnCancel,
		Name:            *lease,
		Coordinated:     *coordinated,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(leadingCtx context.Context) {
				mu.Lock()
				if !stopped {
					leading = true
					emit(event{Event: "started_leading", Identity: *identity})
				}
				mu.Unlock()
				// The work guarded by the lease would stop here.
				<-leadingCtx.Done()
				stop()
			},
			OnStoppedLeading: stop,
			OnNewLeader: func(leader string) {
				emit(event{Event: "new_leader", Identity: *identity, Leader: leader})
			},
		},
	})
	if err != nil {
		fail("%v", err)
	}

	elector.Run(ctx) // returns once cancelled or leadership is lost

	code := exitLostLeadership
	if ctx.Err() != nil { // only a signal cancels ctx
		code = 0
	}
	emit(event{Event: "exit", Identity: *identity, Code: &code})
	os.Exit(code)
}
