//! A sysfs tree built from a fixture layout in a temporary folder, removed
//! when dropped; shared by the tests that build their own trees.

use std::fs;
use std::path::{Path, PathBuf};

use uct_topo::fixture;

pub struct Tree(PathBuf);

impl Tree {
    /// Builds `layout` (the fixture format) under a folder named by `tag`.
    pub fn new(tag: &str, layout: &str) -> Tree {
        let dir = std::env::temp_dir().join(format!("uct-topo-{}-{tag}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fixture::build(layout, &dir).unwrap();
        Tree(dir)
    }

    /// The root to discover (what UCT_SYSFS_ROOT would name).
    pub fn root(&self) -> &Path {
        &self.0
    }

    /// A path under the tree's `sys`.
    pub fn sys(&self, rel: &str) -> PathBuf {
        self.0.join("sys").join(rel)
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
