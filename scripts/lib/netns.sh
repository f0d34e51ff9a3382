# shellcheck shell=bash
# Emulated links in network namespaces, shared by scripts/netbench,
# scripts/torchbench, scripts/wirebytes and scripts/diloco: source it, then
# call netns_init before anything else.
#
# Everything it creates lives in namespaces whose names start with the
# caller's prefix (gcnb-, gctb-): a hub namespace (PREFIXhub) holding a
# bridge, one namespace per host (PREFIXrR: a rank, or a node whose ranks
# share it) joined to the bridge by a veth pair (PREFIXhR in the hub,
# PREFIXvR in the host's namespace, address NET.(R+1)/24; the bridge has
# NET.254), and a tbf rate limit on both ends of each veth (egress each
# way), so every host has its own full-duplex port of that rate, as on a
# switch; or one namespace (PREFIXlo) whose loopback
# carries every rank. The root namespace's interfaces, routes and qdiscs
# are never touched. Deleting a namespace takes its veths, bridge and
# qdiscs with it.

# netns_init NAME PREFIX NET: NAME prefixes messages (e.g. scripts/netbench),
# PREFIX names the namespaces, NET is the /24 (three octets) the star uses.
netns_init() {
  NETNS_NAME=$1
  NETNS_PREFIX=$2
  NETNS_NET=$3
  NETNS_HUB=${NETNS_PREFIX}hub
  NETNS_LO=${NETNS_PREFIX}lo
}

netns_die() { echo "$NETNS_NAME: $*" >&2; exit 1; }

# netns_require TOOL...: dies unless running as root with every TOOL (and
# ip, tc, timeout, flock) on PATH.
netns_require() {
  local tool
  [ "$(id -u)" -eq 0 ] || netns_die "must run as root (network namespaces, tc)"
  for tool in ip tc timeout flock "$@"; do
    command -v "$tool" >/dev/null 2>&1 || netns_die "$tool not found (ip, tc: iproute2; mpirun: openmpi-bin)"
  done
}

# netns_lock FILE: one run at a time (the namespace names are fixed); exits
# 75 when another run holds FILE. Holds it on fd 9 until the script exits.
netns_lock() {
  exec 9>"$1"
  flock -n 9 || { echo "$NETNS_NAME: another run holds $1" >&2; exit 75; }
}

# netns_list prints the PREFIX* namespaces.
netns_list() { ip netns list | awk -v p="$NETNS_PREFIX" 'index($1, p) == 1 { print $1 }'; }

# netns_cleanup ends the processes left in PREFIX* namespaces (ours: nothing
# else runs there) and deletes the namespaces. Idempotent.
netns_cleanup() {
  local ns pids
  for ns in $(netns_list); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    # shellcheck disable=SC2086 # a list of pids
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || echo "$NETNS_NAME: could not delete namespace $ns" >&2
  done
}

# netns_tbf_args LINK prints tc's tbf parameters for 10mbit, 100mbit, 1gbit
# or 10gbit: the bucket holds at least rate/HZ and a few 64 KiB GSO
# packets; the queue holds up to latency's worth of bytes.
netns_tbf_args() {
  case $1 in
    10mbit) echo "rate 10mbit burst 128kb latency 200ms" ;;
    100mbit) echo "rate 100mbit burst 256kb latency 100ms" ;;
    1gbit) echo "rate 1gbit burst 512kb latency 50ms" ;;
    10gbit) echo "rate 10gbit burst 4mb latency 20ms" ;;
    *) netns_die "no rate limit known for link '$1'" ;;
  esac
}

# netns_star LINK HOSTS builds the hub, HOSTS host namespaces (one per rank,
# or one per node of several ranks) and their veths limited to LINK's rate
# (netns_tbf_args).
netns_star() {
  local tbf r ns
  tbf=$(netns_tbf_args "$1")
  ip netns add "$NETNS_HUB"
  ip -n "$NETNS_HUB" link set lo up
  ip -n "$NETNS_HUB" link add "${NETNS_PREFIX}br0" type bridge
  ip -n "$NETNS_HUB" addr add "$NETNS_NET.254/24" dev "${NETNS_PREFIX}br0"
  ip -n "$NETNS_HUB" link set "${NETNS_PREFIX}br0" up
  for ((r = 0; r < $2; r++)); do
    ns=${NETNS_PREFIX}r$r
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$NETNS_HUB" link add "${NETNS_PREFIX}h$r" type veth peer name "${NETNS_PREFIX}v$r" netns "$ns"
    ip -n "$NETNS_HUB" link set "${NETNS_PREFIX}h$r" master "${NETNS_PREFIX}br0" up
    ip -n "$ns" addr add "$NETNS_NET.$((r + 1))/24" dev "${NETNS_PREFIX}v$r"
    ip -n "$ns" link set "${NETNS_PREFIX}v$r" up
    # shellcheck disable=SC2086 # $tbf is a list of words
    tc -n "$NETNS_HUB" qdisc add dev "${NETNS_PREFIX}h$r" root tbf $tbf
    # shellcheck disable=SC2086
    tc -n "$ns" qdisc add dev "${NETNS_PREFIX}v$r" root tbf $tbf
  done
}

# netns_loopback creates PREFIXlo with its loopback up.
netns_loopback() {
  ip netns add "$NETNS_LO"
  ip -n "$NETNS_LO" link set lo up
}

# netns_load prints the load average (1, 5, 15 minutes).
netns_load() { cut -d' ' -f1-3 /proc/loadavg; }
