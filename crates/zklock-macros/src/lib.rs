//! The `#[distributed_lock]` attribute of zklock. Use it through the `zklock` crate.
mod attr;
mod expand;
mod template;
#[cfg(test)]
mod tests;

use proc_macro::TokenStream;

/// placeholder docs
#[proc_macro_attribute]
pub fn distributed_lock(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::distributed_lock(attr.into(), item.into()).into()
}
