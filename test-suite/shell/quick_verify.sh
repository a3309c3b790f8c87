#!/usr/bin/env bash
# What is present here: components, modules, transports, memory domains, and
# one validated transfer per transport. What the run expects (lib.sh) and
# does not find FAILS with the reason transport-info gives; only what is
# not expected is SKIPPED, with the reason.
set -uo pipefail
SUITE=quick_verify
. "$(dirname "$0")/lib.sh"
need_bins transport-info perftest
TI="$BIN_DIR/transport-info"

# Both listings must succeed and say something: a tool that fails or
# prints nothing must not leave every check below to pass or skip on
# empty text.
all=$("$TI" -a 2>/dev/null)
rc=$?
if [ "$rc" -eq 0 ] && grep -q '^# Components$' <<<"$all"; then
    pass "transport-info -a runs"
else
    fail "transport-info -a: exit $rc, component list $(grep -q '^# Components$' <<<"$all" || echo not) printed"
fi
devices=$("$TI" -d 2>/dev/null)
rc=$?
if [ "$rc" -eq 0 ] && grep -q '^# Memory domain: ' <<<"$devices"; then
    pass "transport-info -d runs"
else
    fail "transport-info -d: exit $rc, $(grep -c '^# Memory domain: ' <<<"$devices") memory domains listed"
fi

echo "-- components"
# Only the Components section of -a, and only its "NAME: ... [builtin]"
# lines: an absent transport or memory domain ("#    NAME: reason",
# further down) must not pass for a component.
components=$(sed -n '/^# Components$/,/^# Loadable modules$/p' <<<"$all")
for c in self sm tcp gaudi; do
    if grep -qE "^# +$c: .*\[builtin\]\$" <<<"$components"; then
        pass "component $c is built in"
    else
        fail "component $c is missing from the components of transport-info -a"
    fi
done

echo "-- modules"
for m in example ib; do
    # The module that provides an expected transport must load.
    provides=loop
    [ "$m" = ib ] && provides=rc
    line=$(grep -E "^# module $m\b" <<<"$all" | head -n 1)
    if [ -z "$line" ]; then
        absent "$provides" "module $m: not found in the module path (build the workspace to get libuct_$m.so)"
    elif grep -qE "^# module $m +loaded " <<<"$line"; then
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
        absent "$t" "transport $t: $(absent_reason "$t")"
    fi
done

echo "-- memory domains"
# Each memory domain listed names its component (one of those built in or
# loaded), its flags, and what it can do (allocate or register); and each
# expected transport's memory domain is listed.
loaded_components=$(sed -n 's/^# *\([a-z0-9_]*\): .*\[\(builtin\|module [^]]*\)\]$/\1/p' <<<"$components")
md_block() { awk -v md="$1" '/^# Memory domain: /{on = ($4 == md)} on' <<<"$2"; }
md_ok() {
    local block comp
    block=$(md_block "$1" "$2")
    comp=$(sed -n 's/^#  *Component: //p' <<<"$block" | head -n 1)
    [ -n "$comp" ] || { echo "no component line"; return 1; }
    grep -qx "$comp" <<<"$loaded_components" || { echo "component $comp is not in the component list"; return 1; }
    grep -qE '^# +flags: ' <<<"$block" || { echo "no flags line"; return 1; }
    grep -qE '^# +(allocate|register): ' <<<"$block" || { echo "neither allocates nor registers"; return 1; }
    echo "component $comp; $(sed -n 's/^# *flags: //p' <<<"$block" | head -n 1)"
}
for md in $(sed -n 's/^# Memory domain: //p' <<<"$devices"); do
    if what=$(md_ok "$md" "$devices"); then
        pass "memory domain $md: $what"
    else
        fail "memory domain $md: $what"
    fi
done
for t in self posix cma tcp loop; do
    expected "$t" || continue
    if ! grep -qE "^#  +Transport: $t\$" <<<"$devices"; then
        continue # failed above, as a transport
    fi
    md=$(awk -v t="$t" '/^# Memory domain: /{md=$4} $0 ~ "^#  +Transport: " t "$" {print md; exit}' <<<"$devices")
    if [ -n "$md" ]; then
        pass "transport $t has its memory domain $md"
    else
        fail "transport $t is listed under no memory domain"
    fi
done
if [ -e "$SIM_LIB" ]; then
    sim=$(UCT_GAUDI_HLTHUNK_LIB="$SIM_LIB" "$TI" -d 2>/dev/null)
    for g in gaudi0 gaudi1; do
        if what=$(md_ok "$g" "$sim") && grep -A2 "^# Memory domain: $g\$" <<<"$sim" | grep -q SIMULATED; then
            pass "memory domain $g with the hl-thunk simulator (test double): $(md_block "$g" "$sim" | sed -n 's/^# *Device: //p' | cut -d';' -f1)"
        elif grep -qE "^# Memory domain: $g\$" <<<"$sim"; then
            fail "memory domain $g with the simulator: ${what:-not marked SIMULATED}"
        else
            absent "$g" "memory domain $g is missing with UCT_GAUDI_HLTHUNK_LIB=$SIM_LIB: $(sed -n 's/^# *gaudi: //p' <<<"$sim" | head -n 1)"
        fi
    done
else
    for g in gaudi0 gaudi1; do
        absent "$g" "memory domain $g with the simulator: $SIM_LIB not built"
    done
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
        absent "$t" "perftest -t $t: transport absent ($(absent_reason "$t"))"
    fi
done

summary
