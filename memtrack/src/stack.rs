//! Call stacks: where an allocation was made.
//!
//! A recording holds a table of distinct [`Stack`]s and a table of [`Module`]s (the files the
//! code of those stacks was loaded from). An [`Event`](crate::event::Event) names its stack by
//! [`StackId`]; a stack's [`Frame`]s name their module by [`ModuleId`] and a *file offset* in
//! it, so a stack can be symbolized after the process exited, from the files alone.
//!
//! Only allocating events carry a stack: DHAT's accounting attributes a block's whole life to
//! the stack that allocated it, so a free never carries one.

use serde::{Deserialize, Serialize};

/// The id of a distinct [`Stack`] in a recording's stack table.
///
/// [`StackId::NONE`] (0) means "no stack recorded" (a recorder that does not capture stacks, a
/// free, a mapping); ids ≥ 1 index the recording's stack table. Ids are assigned by the
/// recorder and are only meaningful within one recording.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct StackId(pub u32);

impl StackId {
    /// No stack recorded.
    pub const NONE: StackId = StackId(0);

    /// Whether this is [`StackId::NONE`].
    pub const fn is_none(self) -> bool {
        self.0 == 0
    }
}

/// The id of a [`Module`] in a recording's module table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ModuleId(pub u32);

impl ModuleId {
    /// An address outside any file-backed mapping (anonymous memory, JIT code, the vdso): the
    /// [`Frame::offset`] of a frame in this module is the absolute address.
    pub const UNKNOWN: ModuleId = ModuleId(0);
}

/// A file whose code appears in stacks (an executable or a shared library).
///
/// A module is a file, not a mapping: the same library mapped into two processes (at two
/// addresses) is one module, because frames store file offsets.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Module {
    /// The file's path as the process saw it (`/proc/PID/maps`), valid UTF-8.
    pub path: String,
    /// The ELF build id (`NT_GNU_BUILD_ID` note), if the file has one: a symbolizer checks it
    /// against the file it finds at `path`, so that a rebuilt file gives no wrong names.
    pub build_id: Option<Vec<u8>>,
}

/// One return address of a [`Stack`], as a module and a file offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Frame {
    /// The module the address falls in; [`ModuleId::UNKNOWN`] if none.
    pub module: ModuleId,
    /// The offset in the module's *file* (return address − mapping start + the mapping's file
    /// offset); the absolute address if `module` is [`ModuleId::UNKNOWN`].
    pub offset: u64,
}

impl Frame {
    /// Where a frame-pointer walk left the code: the walk read a "return address" outside every
    /// executable mapping of the process, so it had followed a frame pointer that code built
    /// without frame pointers had used for data. The recorder ends the stack with this frame
    /// instead of that address and the words the walk read after it (data, different at every
    /// allocation: kept, they would make each allocation through such code a call site of its
    /// own). A [`ModuleId::UNKNOWN`] frame at address 0, which no return address is.
    pub const BROKEN: Frame = Frame {
        module: ModuleId::UNKNOWN,
        offset: 0,
    };
}

/// A call stack: the return addresses that led to an allocation, innermost first.
///
/// `frames[0]` is the return address into the code that called the allocator (the allocation's
/// call site), `frames[1]` its caller's, and so on outwards.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Stack {
    /// The frames, innermost first.
    pub frames: Vec<Frame>,
    /// The walk stopped at the recorder's depth cap: outer frames are missing.
    pub truncated: bool,
}
