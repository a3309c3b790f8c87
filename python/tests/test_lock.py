"""The binding's own Cargo.lock (python/ is its own workspace) must pin the
root workspace's versions of every crate both use: a loadable module
(libuct_ib.so, built in the root workspace) runs inside this extension,
and its fingerprint covers uct-core's source, compiler and profile, not
the versions of the crates that cross the boundary with it (log, say)."""

import os
import tomllib
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def versions(path):
    with open(path, "rb") as f:
        lock = tomllib.load(f)
    found = defaultdict(set)
    for p in lock.get("package", []):
        if "source" in p:  # from a registry, not a path in this repository
            found[p["name"]].add(p["version"])
    return found


def test_the_bindings_lock_pins_the_workspaces_versions():
    root = versions(os.path.join(ROOT, "Cargo.lock"))
    ours = versions(os.path.join(ROOT, "python", "Cargo.lock"))
    differ = {
        name: (sorted(ours[name]), sorted(root[name]))
        for name in ours
        if name in root and not ours[name] <= root[name]
    }
    assert not differ, (
        f"python/Cargo.lock pins other versions than Cargo.lock (python, root): {differ}; "
        "sync it: cp Cargo.lock python/Cargo.lock && cargo metadata --manifest-path python/Cargo.toml "
        "--format-version 1 >/dev/null (cargo keeps the root's versions and adds PyO3's crates)"
    )
