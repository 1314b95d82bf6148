#!/usr/bin/env bash
# Installs the Debian packages the tests and the lab need. Idempotent: it does nothing when
# everything is present, and runs `apt-get update` at most once.
set -euo pipefail

packages=(
  etcd-server   # the API server's store in integration tests
  frr           # the lab's BGP router (zebra, bgpd, bfdd)
  iproute2      # ip netns, veth, bridges
  iputils-ping  # reachability checks in the lab
  arping        # ARP probes from the lab's client
  tcpdump       # packet captures when a lab test fails
  nftables      # partitions in the lab (the control-plane e2e); kube-proxy's nftables mode
  # The real cluster (test/kubecluster): container runtime, pod network, kube-proxy's tools.
  containerd
  runc
  containernetworking-plugins  # bridge, host-local, portmap: the pods' CNI
  iptables      # the CNI bridge plugin's masquerade rules
  conntrack     # kube-proxy clears stale UDP flows with it
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages: ${missing[*]}; run as root (or install them yourself)" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# Daemons must not start on the host: the lab starts its own inside namespaces.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
