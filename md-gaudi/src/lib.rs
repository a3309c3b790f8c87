//! Gaudi memory domain over hl-thunk loaded at run time (issue: Gaudi). Not built yet.
