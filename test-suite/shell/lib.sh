# Shared by the shell suites: where the binaries are, and PASS/FAIL/SKIP
# bookkeeping. A skipped check always says why; it never counts as passed.
# Each suite ends with one line: "<suite>: N passed, N failed, N skipped".

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN_DIR=${SUITE_BIN_DIR:-$ROOT/target/debug}
PASSED=0
FAILED=0
SKIPPED=0

# The hl-thunk simulator (a TEST DOUBLE for Gaudi's driver library).
SIM_LIB=${SUITE_SIM_LIB:-$BIN_DIR/libhlthunk_sim.so}

pass() { PASSED=$((PASSED + 1)); echo "PASS  $*"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL  $*"; }
skip() { SKIPPED=$((SKIPPED + 1)); echo "SKIP  $*"; }

# check NAME CMD...: passes when CMD exits 0; on failure shows its output.
check() {
    local name=$1
    shift
    local out
    if out=$("$@" 2>&1); then
        pass "$name"
    else
        fail "$name"
        printf '%s\n' "$out" | sed 's/^/      /' | tail -n 15
    fi
}

# Like check, but a pass shows what the command itself reported on its last
# line (its real counts), after `prefix: ` is stripped, then `suffix`.
check_reported() {
    local name=$1 prefix=$2 suffix=$3
    shift 3
    local out
    if out=$("$@" 2>&1); then
        out=$(tail -n 1 <<<"$out")
        pass "${out#"$prefix": }$suffix"
    else
        fail "$name"
        printf '%s\n' "$out" | sed 's/^/      /' | tail -n 15
    fi
}

need_bins() {
    local b
    for b in "$@"; do
        if [ ! -x "$BIN_DIR/$b" ]; then
            echo "$SUITE: $BIN_DIR/$b is missing; build first: cargo build --workspace" >&2
            echo "$SUITE: 0 passed, 1 failed, 0 skipped"
            exit 1
        fi
    done
}

# Expected coverage: the transports and memory domains a run must find. On
# a host: self, posix, cma, tcp, the example module's loop and the
# simulator's gaudi0/gaudi1; inside scripts/rxe-vm (RXE_VM_DEVICE set) also
# rc. UCT_TEST_EXPECT (a comma list) replaces the set explicitly, and the
# summary then says what it left out. Whatever is expected and missing is a
# FAIL; only what is not expected may be skipped.
DEFAULT_EXPECT="self posix cma tcp loop gaudi0 gaudi1"
[ -n "${RXE_VM_DEVICE:-}" ] && DEFAULT_EXPECT="$DEFAULT_EXPECT rc"
KNOWN_COVERAGE=" self posix cma tcp loop rc gaudi0 gaudi1 "
if [ -n "${UCT_TEST_EXPECT+set}" ]; then
    EXPECT=" $(tr ', ' '  ' <<<"$UCT_TEST_EXPECT") "
    # An empty list would expect nothing, and a typo would expect a name no
    # check looks for: both are errors, not a quiet narrowing.
    if [ -z "${EXPECT// /}" ]; then
        fail "UCT_TEST_EXPECT is set but names nothing; unset it for the default set, or name what this run needs"
    fi
    for name in $EXPECT; do
        [[ "$KNOWN_COVERAGE" == *" $name "* ]] \
            || fail "UCT_TEST_EXPECT names $name, which is none of:$KNOWN_COVERAGE"
    done
else
    EXPECT=" $DEFAULT_EXPECT "
fi
expected() { [[ "$EXPECT" == *" $1 "* ]]; }

# absent NAME WHAT...: NAME is missing; FAIL when it is expected, else SKIP.
absent() {
    local name=$1
    shift
    if expected "$name"; then
        fail "$* [$name is expected]"
    else
        skip "$*"
    fi
}

# The reason the registry gives for an absent transport
# (Registry::explain_absent, as transport-info -t prints it).
absent_reason() {
    local why
    why=$("$BIN_DIR/transport-info" -t "$1" 2>&1 >/dev/null | grep -v '^\[WARN' | head -n 1)
    echo "${why#transport-info: }"
}

summary() {
    if [ -n "${UCT_TEST_EXPECT+set}" ]; then
        local n left=""
        for n in $DEFAULT_EXPECT; do
            expected "$n" || left="$left $n"
        done
        echo "$SUITE: UCT_TEST_EXPECT=$UCT_TEST_EXPECT narrows the expected coverage; left out:${left:- none}"
    fi
    echo "$SUITE: $PASSED passed, $FAILED failed, $SKIPPED skipped"
    [ "$FAILED" -eq 0 ]
}
