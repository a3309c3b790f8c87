#!/usr/bin/env bash
# What is present here: modules, devices, transports, memory domains. A
# component that is absent is SKIPPED with the reason transport-info gives.
set -uo pipefail
SUITE=quick_verify
. "$(dirname "$0")/lib.sh"
need_bins transport-info perftest
TI="$BIN_DIR/transport-info"

all=$("$TI" -a 2>&1) && pass "transport-info -a runs" || fail "transport-info -a: $all"
devices=$("$TI" -d 2>/dev/null)

echo "-- components"
for c in self sm tcp gaudi; do
    if grep -q "^# Component: $c\b\|^#  *$c:\|component $c\b" <<<"$all" \
        || grep -qE "^# +Component: $c\$" <<<"$devices"; then
        pass "component $c is built in"
    else
        fail "component $c is missing from transport-info -a"
    fi
done

echo "-- modules"
for m in example ib; do
    line=$(grep -E "^# module $m\b" <<<"$all" | head -n 1)
    if [ -z "$line" ]; then
        skip "module $m: not found in the module path (build the workspace to get libuct_$m.so)"
    elif grep -q "loaded" <<<"$line" && ! grep -q "not loaded" <<<"$line"; then
        pass "module $m: $(sed 's/^# module //' <<<"$line")"
    else
        fail "module $m: $(sed 's/^# module //' <<<"$line")"
    fi
done

echo "-- transports"
for t in self posix cma tcp rc loop; do
    if grep -qE "^#  +Transport: $t\$" <<<"$devices"; then
        devs=$(grep -E -A1 "^#  +Transport: $t\$" <<<"$devices" | sed -n 's/^#  *Device: //p' | tr '\n' ' ')
        pass "transport $t on: ${devs:-?}"
    else
        skip "transport $t: $(absent_reason "$t")"
    fi
done

echo "-- memory domains"
for md in $(sed -n 's/^# Memory domain: //p' <<<"$devices"); do
    pass "memory domain $md"
done
if [ -e "$SIM_LIB" ]; then
    sim=$(UCT_GAUDI_HLTHUNK_LIB="$SIM_LIB" "$TI" -d 2>/dev/null)
    for g in gaudi0 gaudi1; do
        if grep -qE "^# Memory domain: $g\$" <<<"$sim"; then
            pass "memory domain $g with the hl-thunk simulator (test double): $(grep -A2 "^# Memory domain: $g\$" <<<"$sim" | sed -n 's/^# *Device: //p' | cut -d';' -f1)"
        else
            fail "memory domain $g is missing with UCT_GAUDI_HLTHUNK_LIB=$SIM_LIB"
        fi
    done
else
    skip "gaudi memory domains with the simulator: $SIM_LIB not built"
fi
if grep -qE "^# Memory domain: gaudi0\$" <<<"$devices"; then
    pass "gaudi0 with the system's hl-thunk"
else
    skip "gaudi with the system's hl-thunk: $(sed -n 's/^# *gaudi: //p' <<<"$devices" | head -n 1)"
fi

echo "-- a transfer on each transport present"
for t in self posix cma tcp rc; do
    if grep -qE "^#  +Transport: $t\$" <<<"$devices"; then
        check "perftest -t $t put_bw 4k --validate" \
            "$BIN_DIR/perftest" -t "$t" --test put_bw -s 4k -n 50 --validate
    else
        skip "perftest -t $t: transport absent ($(absent_reason "$t"))"
    fi
done

summary
