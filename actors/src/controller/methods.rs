//! The names the method runtimes had under the controller (issue 33 moved them to
//! `crate::method`); kept so that `keel_actors::controller::methods::…` still resolves for the
//! integration tests and the remote roles. Invariants MS-1..4 are stated where the code is now:
//! `method/rtpo.rs` (MS-1), `method/pats.rs` (MS-2, MS-4), `method/armor.rs` (MS-3).

pub use crate::method::armor::REFERENCE_RESET_TAG;
pub use crate::method::life_tag;
pub use crate::method::pats::{PatsPointer, PatsRuntime, PATS_STATE};
pub use crate::method::rtpo::{RtpoTree, RTPO_STATE};
pub use crate::method::StateWrite;
