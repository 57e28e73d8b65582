#!/bin/sh
# The real-node tests' stand-in for a user's program (scripts/image.sh app): it knows nothing of
# kube-leader. It says when it starts and when SIGTERM stops it, and works in a loop meanwhile.
trap 'echo "app: stopping as ${POD_NAME:-unknown}"; exit 0' TERM INT
echo "app: started as ${POD_NAME:-unknown} (fencing token ${KUBE_LEADER_FENCING_TOKEN:-none})"
while :; do
  sleep 1 &
  wait $!
done
