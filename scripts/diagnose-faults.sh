#!/usr/bin/env bash
# Faults for validating `ccbench diagnose` on the dual-plane testbed (`ccbench testbed up
# --planes 2`), injected with tc and ip in the hosts' namespaces only, as an operator would:
# not through `ccbench testbed fault`, and unknown to diagnose.
#
#   scripts/diagnose-faults.sh ecmp HA HB RATE       HA<->HB at RATE on plane eth1 only (one
#                                                    bad ECMP member: both directions)
#   scripts/diagnose-faults.sh flap H IF [DOWN UP]   H's IF down DOWN s, up UP s (default 3 3),
#                                                    until killed (then left up)
#   scripts/diagnose-faults.sh down H IF | up H IF   H's IF down / up
#   scripts/diagnose-faults.sh slowport H IF RATE    H's IF sends at RATE (the other port not)
#   scripts/diagnose-faults.sh oneway H RATE         H's sending side at RATE on every NIC
#   scripts/diagnose-faults.sh clear H LINK          H's NICs (both ends) back to tbf at LINK
#
# H is hI (namespace ccb-hI; addresses 10.213.P.(I+1) on ethP, 10.213.8.(I+1) on lo).
set -euo pipefail

ns() { echo "ccb-$1"; }
index() { echo "${1#h}"; }
tbf() {  # tbf DEV RATE [NETNS]: as the testbed shapes a link
    local burst=16000
    if [[ -n "${3:-}" ]]; then
        tc -n "$3" qdisc replace dev "$1" root tbf rate "$2" burst "$burst" latency 50ms
    else
        tc qdisc replace dev "$1" root tbf rate "$2" burst "$burst" latency 50ms
    fi
}
member() {  # member FROM TO RATE: FROM's eth1 sends to TO's addresses at RATE, the rest at 50M
    local n to
    n=$(ns "$1")
    to=$(( $(index "$2") + 1 ))
    tc -n "$n" qdisc replace dev eth1 root handle 1: htb default 10
    tc -n "$n" class replace dev eth1 parent 1: classid 1:10 htb rate "${LINK:-50mbit}"
    tc -n "$n" class replace dev eth1 parent 1: classid 1:20 htb rate "$3"
    for dst in "10.213.8.$to" "10.213.1.$to"; do
        tc -n "$n" filter add dev eth1 parent 1: protocol ip prio 1 u32 \
            match ip dst "$dst/32" flowid 1:20
    done
}

case "${1:-}" in
    ecmp) member "$2" "$3" "$4"; member "$3" "$2" "$4" ;;
    flap)
        down_s=${4:-3}; up_s=${5:-3}
        trap 'ip -n "$(ns "$2")" link set "$3" up; exit 0' INT TERM
        while :; do
            ip -n "$(ns "$2")" link set "$3" down; sleep "$down_s"
            ip -n "$(ns "$2")" link set "$3" up; sleep "$up_s"
        done ;;
    down|up) ip -n "$(ns "$2")" link set "$3" "$1" ;;
    slowport) tbf "$3" "$4" "$(ns "$2")" ;;
    oneway) for nic in eth0 eth1; do tbf "$nic" "$3" "$(ns "$2")"; done ;;
    clear)
        for p in 0 1; do
            tc -n "$(ns "$2")" qdisc del dev "eth$p" root 2>/dev/null || true
            tbf "eth$p" "$3" "$(ns "$2")"
            tbf "ccb-$2-$p" "$3"
            ip -n "$(ns "$2")" link set "eth$p" up
        done ;;
    *) sed -n '2,17p' "$0"; exit 2 ;;
esac
