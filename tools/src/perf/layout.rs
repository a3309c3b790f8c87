//! Before anything is measured: which data layout (short, bcopy, zcopy)
//! each size runs with, and whether every size can run at all; each
//! refusal says what would work.

use uct_core::{Caps, IfaceAttrs};

use super::error::{PerfError, Result};
use super::params::{Layout, Op, Params, TestKind};
use super::session::Session;

/// The layout used for `size`: the one asked for, or the cheapest the
/// transport offers; an error says what would work.
pub fn layout_for(session: &Session, size: usize) -> Result<Layout> {
    layout_in(session.iface.attrs(), &session.params, size)
}

/// [`layout_for`] from the iface's attributes alone, so that a server can
/// check a client's proposal before it allocates anything.
pub fn layout_in(attrs: &IfaceAttrs, params: &Params, size: usize) -> Result<Layout> {
    let test = params.test;
    let tl = &params.transport;
    if test.op() == Op::Atomic {
        return Ok(Layout::Short);
    }
    let (limits, short, bcopy, zcopy) = match test.op() {
        Op::Put => (attrs.put, Caps::PUT_SHORT, Caps::PUT_BCOPY, Caps::PUT_ZCOPY),
        Op::Get => (attrs.get, Caps::GET_SHORT, Caps::GET_BCOPY, Caps::GET_ZCOPY),
        _ => (attrs.am, Caps::AM_SHORT, Caps::AM_BCOPY, Caps::AM_ZCOPY),
    };
    // (layout, the capability it needs, the most bytes it carries), the
    // cheapest first. A get's bcopy hands its bytes back in a new buffer
    // (an allocation and a second copy per get), so a get tries zcopy,
    // which lands in the registered buffer, before bcopy.
    let mut offered: Vec<(Layout, Caps, usize)> = vec![
        (Layout::Short, short, limits.max_short),
        (Layout::Bcopy, bcopy, limits.max_bcopy),
        (Layout::Zcopy, zcopy, limits.max_zcopy),
    ];
    if test.op() == Op::Get {
        offered.swap(1, 2);
    }
    let offered: Vec<(Layout, Caps, usize)> = offered
        .into_iter()
        .filter(|(_, cap, _)| attrs.caps.contains(*cap))
        .collect();
    let what_works = || {
        offered
            .iter()
            .map(|(layout, _, max)| {
                format!(
                    "-D {} up to {}",
                    layout.name(),
                    crate::text::size(*max as u64)
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    if offered.is_empty() {
        let what = match test.op() {
            Op::Put => "puts",
            Op::Get => "gets",
            _ => "active messages",
        };
        return Err(PerfError::Usage(format!(
            "{tl} cannot run {}: it has no {what}; `transport-info -d` shows what each transport offers (posix has them all)",
            test.name()
        )));
    }
    match params.layout {
        Some(asked) => match offered.iter().find(|(layout, _, _)| *layout == asked) {
            Some((_, _, max)) if size <= *max => Ok(asked),
            Some((_, _, max)) => Err(PerfError::Usage(format!(
                "{} {} carries at most {} bytes on {tl}, not {size}; use {}",
                test.name(),
                asked.name(),
                max,
                what_works()
            ))),
            None => Err(PerfError::Usage(format!(
                "{tl} has no {} {}; use {}",
                asked.name(),
                test.name(),
                what_works()
            ))),
        },
        None => offered
            .iter()
            .find(|(_, _, max)| size <= *max)
            .map(|(layout, _, _)| *layout)
            .ok_or_else(|| {
                PerfError::Usage(format!(
                    "{size} bytes is more than {tl} carries in one {}; use sizes up to {}",
                    test.name(),
                    crate::text::size(
                        offered.iter().map(|(_, _, max)| *max).max().unwrap_or(0) as u64
                    )
                ))
            }),
    }
}

/// Checks that every size can run, before anything is measured.
pub fn check_sizes(session: &Session) -> Result<()> {
    check_sizes_in(session.iface.attrs(), &session.params)
}

/// [`check_sizes`] from the iface's attributes alone.
pub fn check_sizes_in(attrs: &IfaceAttrs, params: &Params) -> Result<()> {
    let test = params.test;
    for &size in &params.sizes {
        if test.is_atomic() && size != 8 {
            return Err(PerfError::Usage(format!(
                "{} works on 8-byte words; use -s 8",
                test.name()
            )));
        }
        if matches!(test, TestKind::PutLat | TestKind::AmLat) && size < 8 {
            return Err(PerfError::Usage(format!(
                "{} needs at least 8 bytes to carry its sequence number; use -s 8 or more",
                test.name()
            )));
        }
        if test.is_atomic() && !attrs.caps.contains(Caps::ATOMIC64) {
            return Err(PerfError::Usage(format!(
                "{} has no 64-bit atomics; use posix, tcp or rc",
                params.transport
            )));
        }
        layout_in(attrs, params, size)?;
    }
    Ok(())
}
