//! The C ABI called as C calls it (the extern "C" functions, through the
//! rlib): handles that are NULL, freed, never issued or of another kind;
//! a panic turned into a status; bad URLs and keys; writes with
//! notifications over self, posix and tcp in one process; memory that a
//! pending request uses; a destroy with requests and waits pending; the
//! probe and registry listing.

mod common;
mod handles;
mod lifetimes;
mod listing;
mod transfer;
