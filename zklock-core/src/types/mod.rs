//! Shared types, the lowest layer: keys, errors, fencing tokens, loss reasons, modes. Imports
//! nothing else of the crate.

pub(crate) mod backend_kind;
pub(crate) mod disconnect;
pub(crate) mod error;
pub(crate) mod inspect;
pub(crate) mod key;
pub(crate) mod layout;
pub(crate) mod loss;
pub(crate) mod mode;
pub(crate) mod tls;
pub(crate) mod token;
