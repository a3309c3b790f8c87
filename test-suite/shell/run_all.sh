#!/usr/bin/env bash
# Every shell suite, then one line: N passed, N failed, N skipped.
set -uo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
p=0 f=0 s=0 status=0
for suite in quick_verify stress; do
    echo "== $suite"
    out=$(bash "$dir/$suite.sh" 2>&1)
    rc=$?
    printf '%s\n' "$out"
    line=$(tail -n 1 <<<"$out")
    if [[ "$line" =~ ([0-9]+)\ passed,\ ([0-9]+)\ failed,\ ([0-9]+)\ skipped ]]; then
        p=$((p + BASH_REMATCH[1])) f=$((f + BASH_REMATCH[2])) s=$((s + BASH_REMATCH[3]))
    else
        echo "run_all: $suite printed no summary line" >&2
        f=$((f + 1))
    fi
    [ "$rc" -ne 0 ] && status=1
done
echo "$p passed, $f failed, $s skipped"
exit "$status"
