# The janitor of a real kubelet node (testenv/src/node.rs): run by `sh -c`, with
#   KL_NODE_BASE  the base directory of all nodes (holds node.lock and teardown.log),
#   KL_NODE_DIR   this node's directory (containerd's root, state and socket; the kubelet's root).
# The paths come from the environment, never the command line: teardown kills processes whose
# command line holds the node's directory, and this shell must not be one of them.
#
# 1. Takes the machine's node lock (one node per machine: the kubelet uses fixed paths, cgroups
#    and sysctls), tears down nodes that earlier test processes left behind, and says "locked".
# 2. Waits until its standard input closes: the test process dropped the node, or exited,
#    however it exited (even by SIGKILL).
# 3. Tears this node down: its processes and every container process, mounts deepest first,
#    cgroups, /var/log/pods and /var/log/containers, the three sysctls the kubelet changed; then
#    removes the directory and releases the lock by exiting.
set -u
base=$KL_NODE_BASE
dir=$KL_NODE_DIR
exec 9>>"$base/node.lock"
exec 2>>"$base/teardown.log"

say() { printf '%s %s\n' "$(date -u +%H:%M:%S.%N | cut -c1-12)" "$*" >&2; }

# SIGKILL to every process whose command line holds $1 (never this shell or its subshells,
# whose command lines hold no path).
kill_holding() {
  local p cmd
  for p in /proc/[0-9]*; do
    cmd=$( { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null) || continue
    case "$cmd" in
      *"$1"*) kill -KILL "${p#/proc/}" 2>/dev/null && say "killed ${p#/proc/}: $(printf %.100s "$cmd")" ;;
    esac
  done
}

# SIGKILL to every process in the kubelet's cgroups (the containers), until none is left.
kill_containers() {
  local round f pid left
  for round in 1 2 3 4 5 6 7 8 9 10; do
    left=0
    for f in $(find /sys/fs/cgroup/*/kubepods -name cgroup.procs 2>/dev/null); do
      for pid in $(cat "$f" 2>/dev/null); do
        kill -KILL "$pid" 2>/dev/null && left=1
      done
    done
    [ "$left" = 0 ] && return 0
    sleep 0.2
  done
  say "container processes still alive after 10 rounds"
}

mounts_under() { # mount points under $1, deepest first
  awk -v d="$1" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r
}

unmount_under() {
  local round m
  for round in 1 2 3; do
    for m in $(mounts_under "$1"); do
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || say "could not unmount $m"
    done
    [ -z "$(mounts_under "$1")" ] && return 0
  done
}

teardown() {
  local d=$1 c key value
  [ -d "$d" ] || return 0
  say "tearing down $d"
  kill_holding "$d/kubelet"      # the kubelet first: it would restart what is killed next
  kill_containers                # every container of the node
  kill_holding "$d"              # containerd and its shims (their command lines hold the socket)
  sleep 0.2
  kill_containers
  unmount_under "$d"
  for c in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/*/k8s.io; do
    [ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null
  done
  for c in /var/log/pods /var/log/containers /run/containerd; do
    [ -e "$d/created$(echo "$c" | tr / -)" ] && rm -rf "$c"
  done
  if [ -f "$d/sysctls" ]; then
    while read -r key value; do
      [ -n "$key" ] && echo "$value" >"/proc/sys/$key" 2>/dev/null
    done <"$d/sysctls"
  fi
  if [ -z "$(mounts_under "$d")" ]; then
    rm -rf "$d"
    say "removed $d"
  else
    say "left $d: still mounted: $(mounts_under "$d" | tr '\n' ' ')"
  fi
}

flock 9
for stale in "$base"/node-*; do
  [ "$stale" != "$dir" ] && [ -d "$stale" ] && teardown "$stale"
done
echo locked
cat >/dev/null
teardown "$dir"
say "done"
