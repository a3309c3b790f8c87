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

# The reason transport-info gives for an absent transport.
absent_reason() {
    "$BIN_DIR/transport-info" -d 2>/dev/null |
        sed -n "s/^# *$1: //p" | head -n 1
}

summary() {
    echo "$SUITE: $PASSED passed, $FAILED failed, $SKIPPED skipped"
    [ "$FAILED" -eq 0 ]
}
