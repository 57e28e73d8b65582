/*
 * The test workload of the real-node tests: an instrumented `sleep`.
 *
 * The node-test image (scripts/image.sh node-test) is the kube-leader image with this program
 * as /usr/local/bin/sleep, so the sample COMMAND of deploy/deployment.yaml,
 *   sh -c 'echo "leading as ..."; exec sleep infinity'
 * runs unchanged and this program becomes COMMAND. It writes its own records on stdout (the
 * container's log), each stamped with CLOCK_MONOTONIC, the one clock of every process on the
 * host, so the tests can order the records of all Pods exactly:
 *
 *   kl-workload start mono_ns=N pid=P identity=ID namespace=NS token=T   when it starts
 *   kl-workload stop mono_ns=N signal=S                       on SIGTERM/SIGINT/SIGQUIT, then exit 0
 *   kl-workload crash mono_ns=N                               on SIGUSR1, then exit 1 (a crash)
 *   kl-workload fill mono_ns=N bytes=B                        on SIGUSR2, after writing B bytes of
 *                                                             filler to stdout (exceeds an
 *                                                             ephemeral-storage limit: eviction)
 *
 * With any other arguments it is busybox's sleep.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FILL_BYTES (8 * 1024 * 1024)

static unsigned long long mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
}

static const char *env(const char *name) {
  const char *value = getenv(name);
  return value && *value ? value : "-";
}

int main(int argc, char **argv) {
  if (argc != 2 || strcmp(argv[1], "infinity") != 0) {
    argv[0] = "sleep";
    execv("/bin/busybox", argv);
    perror("exec /bin/busybox");
    return 127;
  }

  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGQUIT);
  sigaddset(&set, SIGUSR1);
  sigaddset(&set, SIGUSR2);
  sigprocmask(SIG_BLOCK, &set, NULL);

  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("kl-workload start mono_ns=%llu pid=%d identity=%s namespace=%s token=%s\n", mono_ns(),
         (int)getpid(), env("KUBE_LEADER_IDENTITY"), env("KUBE_LEADER_NAMESPACE"),
         env("KUBE_LEADER_FENCING_TOKEN"));

  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    switch (sig) {
      case SIGUSR1:
        printf("kl-workload crash mono_ns=%llu\n", mono_ns());
        return 1;
      case SIGUSR2: {
        static char line[1024];
        memset(line, 'x', sizeof line - 1);
        line[sizeof line - 1] = '\n';
        for (int written = 0; written < FILL_BYTES; written += (int)sizeof line)
          fwrite(line, 1, sizeof line, stdout);
        printf("kl-workload fill mono_ns=%llu bytes=%d\n", mono_ns(), FILL_BYTES);
        break;
      }
      default:
        printf("kl-workload stop mono_ns=%llu signal=%d\n", mono_ns(), sig);
        return 0;
    }
  }
}
