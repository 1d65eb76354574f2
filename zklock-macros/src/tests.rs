//! Snapshots of the expansion: `snapshots/NAME.rs` holds annotated fns, `NAME.expanded.rs` the
//! same file with every `#[distributed_lock]` expanded and pretty-printed. A reviewer reads the
//! expanded file as plain code; the UI tests compile both. Regenerate with
//! `ZKLOCK_SNAPSHOTS=overwrite cargo test -p zklock-macros`.

use std::path::Path;

use quote::ToTokens;
use syn::visit_mut::VisitMut;

/// Expands every `#[distributed_lock(...)]` fn of a file, free or in an impl block.
struct ExpandAll;

fn take_attr(attrs: &mut Vec<syn::Attribute>) -> Option<proc_macro2::TokenStream> {
    let at = attrs.iter().position(|a| {
        a.path()
            .segments
            .last()
            .is_some_and(|s| s.ident == "distributed_lock")
    })?;
    let attr = attrs.remove(at);
    Some(match attr.meta {
        syn::Meta::List(list) => list.tokens,
        _ => proc_macro2::TokenStream::new(),
    })
}

impl VisitMut for ExpandAll {
    fn visit_item_mut(&mut self, item: &mut syn::Item) {
        if let syn::Item::Fn(func) = item {
            if let Some(args) = take_attr(&mut func.attrs) {
                let out = crate::expand::distributed_lock(args, func.to_token_stream());
                *item = syn::parse2(out).expect("the expansion is an item");
                return;
            }
        }
        syn::visit_mut::visit_item_mut(self, item);
    }

    fn visit_impl_item_mut(&mut self, item: &mut syn::ImplItem) {
        if let syn::ImplItem::Fn(func) = item {
            if let Some(args) = take_attr(&mut func.attrs) {
                let out = crate::expand::distributed_lock(args, func.to_token_stream());
                *item = syn::parse2(out).expect("the expansion is an impl item");
                return;
            }
        }
        syn::visit_mut::visit_impl_item_mut(self, item);
    }
}

fn expand_file(source: &str) -> String {
    let mut file = syn::parse_file(source).expect("the snapshot input parses");
    ExpandAll.visit_file_mut(&mut file);
    let header = "// @generated from the file beside it by the snapshot test of zklock-macros \
                  (src/tests.rs): every #[distributed_lock] expanded.\n";
    format!("{header}{}", prettyplease::unparse(&file))
}

#[test]
fn expansions_match_snapshots() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("snapshots");
    let overwrite = std::env::var_os("ZKLOCK_SNAPSHOTS").is_some_and(|v| v == "overwrite");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if !name.ends_with(".rs") || name.ends_with(".expanded.rs") {
            continue;
        }
        let expanded = expand_file(&std::fs::read_to_string(&path).unwrap());
        let snapshot = path.with_extension("expanded.rs");
        if overwrite {
            std::fs::write(&snapshot, &expanded).unwrap();
        } else {
            let want = std::fs::read_to_string(&snapshot).unwrap_or_default();
            assert!(
                want == expanded,
                "the expansion of {name} changed; review it and regenerate with \
                 ZKLOCK_SNAPSHOTS=overwrite:\n{expanded}"
            );
        }
        checked += 1;
    }
    assert!(checked > 0, "no snapshot inputs in {}", dir.display());
}

#[test]
fn errors_keep_the_fn() {
    // On an error the user's fn is emitted unchanged beside the error.
    let item = quote::quote!(
        fn handler(id: u64) -> Result<(), E> {
            Ok(())
        }
    );
    let out = crate::expand::distributed_lock(quote::quote!("user_{id}"), item.clone());
    let out = out.to_string();
    assert!(out.starts_with(&item.to_string()), "{out}");
    assert!(out.contains("compile_error"), "{out}");
    assert!(out.contains("needs an `async fn`"), "{out}");
}

#[test]
fn a_renamed_crate_is_the_only_path_used() {
    let item = quote::quote!(
        async fn handler(id: u64) -> Result<(), E> {
            Ok(())
        }
    );
    let out = crate::expand::distributed_lock(
        quote::quote!("user_{id}", crate = "my_locks", timeout = "1s"),
        item,
    )
    .to_string();
    assert!(out.contains("my_locks :: __private :: run"), "{out}");
    assert!(!out.contains("zklock ::"), "{out}");
}

#[test]
fn a_job_fn_beside_an_error_keeps_its_body_typed_as_the_body() {
    // Emitted unchanged, `Ok(1)` would not be a `Result<Ran<u64>, Error>`: a second error.
    let item = quote::quote!(
        async fn nightly() -> Result<zklock::Ran<u64>, Error> {
            Ok(1)
        }
    );
    let out = crate::expand::distributed_lock(quote::quote!("nightly", skip_if_locked = 1), item)
        .to_string();
    assert!(out.contains("takes no value"), "{out}");
    assert!(
        out.contains("let __zklock_fake_return : Result < u64 , Error >"),
        "{out}"
    );
    assert!(out.contains("unreachable"), "{out}");
}
