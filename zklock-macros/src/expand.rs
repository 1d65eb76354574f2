//! Builds the tokens of an annotated fn: the key, the manager, the options, and the body run
//! under the lock by `__private::run`.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{AttrStyle, FnArg, Ident, ItemFn, LitStr, Pat, ReturnType, Signature, Type};

use crate::attr::{Args, Mode, OnLost};
use crate::template::{self, Name, Segment};

/// The attribute's entry point, on `proc_macro2` tokens so that tests can call it.
pub(crate) fn distributed_lock(attr: TokenStream, item: TokenStream) -> TokenStream {
    let func = match syn::parse2::<ItemFn>(item.clone()) {
        Ok(func) => func,
        Err(_) => {
            let err = syn::Error::new(
                item_start(&item),
                "#[distributed_lock] goes on an `async fn` with a body (a free fn, or a method in an impl block)",
            );
            return token_stream_with_error(item, err);
        }
    };
    // What stands in for the fn beside an error.
    let fallback = job_fallback(&func).unwrap_or(item);
    let args = match syn::parse2::<Args>(attr) {
        Ok(args) => args,
        Err(err) => return token_stream_with_error(fallback, err),
    };
    match expand(args, func) {
        Ok(tokens) => tokens,
        Err(err) => token_stream_with_error(fallback, err),
    }
}

/// Beside an error, a job fn returning `Result<Ran<T>, E>` cannot be emitted unchanged: its
/// body returns `Result<T, E>`, which would be one more error. It is emitted with its body in
/// an `async` block typed as the body's own return type (so that the IDE still checks it), and
/// a fn body that never runs: the compile fails on the error anyway.
fn job_fallback(func: &ItemFn) -> Option<TokenStream> {
    let ReturnType::Type(_, ret) = &func.sig.output else {
        return None;
    };
    if func.sig.asyncness.is_none() || contains_impl_trait(ret) {
        return None;
    }
    let body_ret = ran_body_type(ret)?;
    let (outer, inner): (Vec<_>, Vec<_>) = func
        .attrs
        .iter()
        .partition(|a| matches!(a.style, AttrStyle::Outer));
    let (vis, sig, stmts) = (&func.vis, &func.sig, &func.block.stmts);
    Some(quote! {
        #(#outer)*
        #vis #sig {
            #(#inner)*
            let _ = async move {
                #[allow(unreachable_code, clippy::diverging_sub_expression)]
                if false {
                    let __zklock_fake_return: #body_ret = loop {};
                    return __zklock_fake_return;
                }
                #(#stmts)*
            };
            ::core::unreachable!()
        }
    })
}

/// The first token of an item after its attributes: `struct`, `pub`, `fn`...
fn item_start(item: &TokenStream) -> Span {
    let mut tokens = item.clone().into_iter().peekable();
    while let Some(tt) = tokens.next() {
        match &tt {
            proc_macro2::TokenTree::Punct(p) if p.as_char() == '#' => {
                tokens.next();
            }
            _ => return tt.span(),
        }
    }
    Span::call_site()
}

/// The user's fn unchanged, beside the error (as tokio-macros does): the IDE keeps working and
/// no follow-on errors appear.
fn token_stream_with_error(mut item: TokenStream, err: syn::Error) -> TokenStream {
    item.extend(err.into_compile_error());
    item
}

/// Every check on the fn and its template, with all errors reported together.
fn expand(args: Args, func: ItemFn) -> syn::Result<TokenStream> {
    let mut errors: Option<syn::Error> = None;
    let mut push = |err: syn::Error| match &mut errors {
        Some(all) => all.combine(err),
        None => errors = Some(err),
    };
    if let Err(err) = check_async(&func.sig) {
        push(err);
    }
    let ret = match result_type(&func.sig) {
        Ok(ret) => Some(ret.clone()),
        Err(err) => {
            push(err);
            None
        }
    };
    let key = match key_expr(&args.key, &func.sig) {
        Ok(key) => Some(key),
        Err(err) => {
            push(err);
            None
        }
    };
    if let Some(err) = errors {
        return Err(err);
    }
    let (ret, key) = (ret.expect("checked"), key.expect("checked"));
    Ok(gen_function(&args, func, &ret, key))
}

fn check_async(sig: &Signature) -> syn::Result<()> {
    if sig.asyncness.is_some() {
        return Ok(());
    }
    Err(syn::Error::new_spanned(
        sig.fn_token,
        format!(
            "#[distributed_lock] needs an `async fn`: make `{}` async, the lock is held while its body awaits",
            sig.ident
        ),
    ))
}

/// The declared return type, which must be spelled as a `Result` (`Result<T, E>`,
/// `io::Result<T>`, `AppResult<T>`): the lock's errors are returned through it.
fn result_type(sig: &Signature) -> syn::Result<&Type> {
    const NEED: &str =
        "Result<T, E> where E: From<zklock::Error>, so that the lock's errors can be returned";
    let ty = match &sig.output {
        ReturnType::Type(_, ty) => &**ty,
        ReturnType::Default => {
            return Err(syn::Error::new_spanned(
                &sig.ident,
                format!(
                    "`{}` returns `()`; #[distributed_lock] needs a return type of {NEED}",
                    sig.ident
                ),
            ))
        }
    };
    let mut inner = ty;
    while let Type::Group(group) = inner {
        inner = &group.elem;
    }
    if let Type::Path(path) = inner {
        if path.qself.is_none()
            && path
                .path
                .segments
                .last()
                .is_some_and(|last| last.ident.to_string().ends_with("Result"))
        {
            return Ok(ty);
        }
    }
    if let Type::Path(path) = inner {
        if path
            .path
            .segments
            .last()
            .is_some_and(|last| last.ident == "Ran")
        {
            return Err(syn::Error::new_spanned(
                ty,
                "a call of a job returns the lock's errors too: write `Result<zklock::Ran<T>, E>` where E: From<zklock::Error>",
            ));
        }
    }
    Err(syn::Error::new_spanned(
        ty,
        format!("#[distributed_lock] needs a return type of {NEED}"),
    ))
}

/// For a return type spelled `SomeResult<Ran<T>, ...>`, the same type with `T` in place of
/// `Ran<T>`: what a job's body returns. `None` for any other return type.
fn ran_body_type(ret: &Type) -> Option<Type> {
    let mut inner = ret;
    while let Type::Group(group) = inner {
        inner = &group.elem;
    }
    let Type::Path(result) = inner else {
        return None;
    };
    let mut body = result.clone();
    let last = body.path.segments.last_mut()?;
    let syn::PathArguments::AngleBracketed(args) = &mut last.arguments else {
        return None;
    };
    let first = args.args.iter_mut().find_map(|arg| match arg {
        syn::GenericArgument::Type(ty) => Some(ty),
        _ => None,
    })?;
    let Type::Path(ran) = &*first else {
        return None;
    };
    let ran = ran.path.segments.last()?;
    if ran.ident != "Ran" {
        return None;
    }
    let syn::PathArguments::AngleBracketed(ran_args) = &ran.arguments else {
        return None;
    };
    let mut types = ran_args.args.iter().filter_map(|arg| match arg {
        syn::GenericArgument::Type(ty) => Some(ty.clone()),
        _ => None,
    });
    let value = types.next()?;
    if types.next().is_some() {
        return None;
    }
    *first = value;
    Some(Type::Path(body))
}

/// The names a fn's parameters bind (`id`, `order`, the names inside destructuring patterns).
fn bindings(pat: &Pat, out: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(p) => {
            out.push(p.ident.clone());
            if let Some((_, sub)) = &p.subpat {
                bindings(sub, out);
            }
        }
        Pat::Tuple(p) => p.elems.iter().for_each(|p| bindings(p, out)),
        Pat::TupleStruct(p) => p.elems.iter().for_each(|p| bindings(p, out)),
        Pat::Struct(p) => p.fields.iter().for_each(|f| bindings(&f.pat, out)),
        Pat::Slice(p) => p.elems.iter().for_each(|p| bindings(p, out)),
        Pat::Reference(p) => bindings(&p.pat, out),
        Pat::Paren(p) => bindings(&p.pat, out),
        Pat::Type(p) => bindings(&p.pat, out),
        _ => {}
    }
}

/// How the key is built.
enum Key {
    /// A template without placeholders: the text itself.
    Text(LitStr),
    /// `format!(format, values...)`, every value spanned at the template so that a value
    /// without `Display` is blamed there.
    Format(LitStr, Vec<TokenStream>),
}

/// Checks the template against the fn's parameters and builds the key.
fn key_expr(lit: &LitStr, sig: &Signature) -> syn::Result<Key> {
    let segments =
        template::parse(&lit.value()).map_err(|msg| syn::Error::new_spanned(lit, msg))?;
    let mut params = Vec::new();
    let mut has_self = false;
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(_) => has_self = true,
            FnArg::Typed(arg) => bindings(&arg.pat, &mut params),
        }
    }
    let span = lit.span();
    let mut format = String::new();
    let mut values = Vec::new();
    for segment in &segments {
        match segment {
            Segment::Text(text) => format.push_str(&text.replace('{', "{{").replace('}', "}}")),
            Segment::Value {
                root,
                fields,
                written,
            } => {
                let root = match root {
                    Name::Ident { name, .. } if name == "self" && has_self => {
                        Ident::new("self", span).into_token_stream()
                    }
                    Name::Ident { name, raw } if params.iter().any(|p| p.unraw() == name) => {
                        if *raw {
                            Ident::new_raw(name, span)
                        } else {
                            Ident::new(name, span)
                        }
                        .into_token_stream()
                    }
                    _ => {
                        return Err(unknown_placeholder(
                            lit, sig, root, written, &params, has_self,
                        ))
                    }
                };
                let fields = fields.iter().map(|field| match field {
                    Name::Ident { name, raw: false } => Ident::new(name, span).into_token_stream(),
                    Name::Ident { name, raw: true } => {
                        Ident::new_raw(name, span).into_token_stream()
                    }
                    Name::Index(i) => syn::Index { index: *i, span }.into_token_stream(),
                });
                format.push_str("{}");
                values.push(quote_spanned!(span=> #root #(.#fields)*));
            }
        }
    }
    if values.is_empty() {
        let text = format.replace("{{", "{").replace("}}", "}");
        return Ok(Key::Text(LitStr::new(&text, span)));
    }
    Ok(Key::Format(LitStr::new(&format, span), values))
}

fn unknown_placeholder(
    lit: &LitStr,
    sig: &Signature,
    root: &Name,
    written: &str,
    params: &[Ident],
    has_self: bool,
) -> syn::Error {
    let mut names: Vec<String> = params.iter().map(|p| p.unraw().to_string()).collect();
    if has_self {
        names.insert(0, "self".into());
    }
    let known = if names.is_empty() {
        format!("`{}` has no parameters", sig.ident)
    } else {
        format!("its parameters: {}", names.join(", "))
    };
    let root = root.as_written();
    let what = if root == "self" {
        format!("`{}` has no `self` receiver", sig.ident)
    } else {
        format!("`{}` has no parameter `{root}`", sig.ident)
    };
    syn::Error::new_spanned(
        lit,
        format!("unknown placeholder `{written}`: {what} ({known})"),
    )
}

/// The annotated fn: same signature, body run by `__private::run` under the lock.
fn gen_function(args: &Args, func: ItemFn, ret: &Type, key: Key) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = func;
    let (outer, inner): (Vec<_>, Vec<_>) = attrs
        .into_iter()
        .partition(|a| matches!(a.style, AttrStyle::Outer));
    let krate = match &args.krate {
        Some(path) => path.to_token_stream(),
        None => quote!(::zklock),
    };
    let private = quote!(#krate::__private);
    let ret_span = ret.span();
    // A job whose fn returns `Result<Ran<T>, E>`: its body returns `Result<T, E>`.
    let ran_body = if args.is_job() {
        ran_body_type(ret)
    } else {
        None
    };
    let body_ret = ran_body.as_ref().unwrap_or(ret);
    // The paths of the calls that need the fn's error type to convert zklock's errors, spanned
    // at the return type as a whole so that a missing `From` is blamed there.
    let private_at_ret = respan(private.clone(), ret_span);

    let key_var = Ident::new("__zklock_key", Span::mixed_site());
    let manager_var = Ident::new("__zklock_manager", Span::mixed_site());
    let key = match key {
        Key::Text(text) => quote!(::std::string::String::from(#text)),
        Key::Format(format, values) => quote!(#private::format!(#format, #(#values),*)),
    };
    let manager = manager(args, &private, &private_at_ret, ret_span);

    let options = call_options(args, &private);
    let job_options = job_options(args, &private);
    let fake_return_edge = fake_return_edge(body_ret, ret_span);
    let stmts = &block.stmts;
    let body = quote! {
        async move {
            #fake_return_edge
            #(#stmts)*
        }
    };
    // The call needs `E: From<zklock::Error>`: spanned at the return type, so that a missing
    // `From` is blamed on the signature.
    let run = if !args.is_job() {
        quote_spanned! {ret_span=>
            #private_at_ret::run(&#manager_var, &#key_var, #options, #body).await
        }
    } else if ran_body.is_some() {
        // `Result<Ran<T>, E>`: a skip is `Ok(Ran::Skipped)`.
        quote_spanned! {ret_span=>
            #private_at_ret::run_job(&#manager_var, &#key_var, #job_options, #body).await
        }
    } else {
        // Any other `Result<T, E>`: a skip is `Err(Error::JobSkipped { .. }.into())`.
        quote_spanned! {ret_span=>
            #private_at_ret::run_required_job(&#manager_var, &#key_var, #job_options, #body).await
        }
    };

    quote! {
        #(#outer)*
        #vis #sig {
            #(#inner)*
            let #key_var = #key;
            let #manager_var = #manager;
            #run
        }
    }
}

/// The manager, as an owned handle so that the body may move every parameter: the
/// attribute's `manager = …`, else the global one (its error converted at the return type).
fn manager(
    args: &Args,
    private: &TokenStream,
    private_at_ret: &TokenStream,
    ret_span: Span,
) -> TokenStream {
    match &args.manager {
        Some(expr) => {
            let private = respan(private.clone(), expr.span());
            quote_spanned! {expr.span()=>
                ::core::clone::Clone::clone(#private::AsLockManager::as_lock_manager(&(#expr)))
            }
        }
        None => quote_spanned!(ret_span=> #private_at_ret::global().await?),
    }
}

/// The `Options` of a lock's run: the attribute's mode, timeout and `on_lost`.
fn call_options(args: &Args, private: &TokenStream) -> TokenStream {
    let mut options = Vec::new();
    if let Some(mode) = args.mode {
        let mode = format_ident!(
            "{}",
            match mode {
                Mode::Exclusive => "Exclusive",
                Mode::Read => "Read",
                Mode::Write => "Write",
            }
        );
        options.push(quote!(mode: #private::Mode::#mode));
    }
    if let Some(millis) = args.timeout {
        let duration = duration(millis);
        options.push(quote!(timeout: ::core::option::Option::Some(#duration)));
    }
    if let Some(on_lost) = args.on_lost {
        let on_lost = format_ident!(
            "{}",
            match on_lost {
                OnLost::Abort => "Abort",
                OnLost::Continue => "Continue",
            }
        );
        options.push(quote!(on_lost: #private::OnLost::#on_lost));
    }
    if options.is_empty() {
        quote!(#private::Options::new())
    } else {
        quote!(#private::Options { #(#options,)* ..#private::Options::new() })
    }
}

/// The `JobOptions` of a job's run: its wait and its `at_least` / `at_most` windows.
fn job_options(args: &Args, private: &TokenStream) -> TokenStream {
    let wait = match args.timeout {
        Some(millis) => {
            let duration = duration(millis);
            quote!(::core::option::Option::Some(#duration))
        }
        None => quote!(::core::option::Option::None),
    };
    let window = |millis: Option<u64>| match millis {
        Some(millis) => {
            let duration = duration(millis);
            quote!(::core::option::Option::Some(#duration))
        }
        None => quote!(::core::option::Option::None),
    };
    let (at_least, at_most) = (window(args.at_least), window(args.at_most));
    quote!(#private::JobOptions { wait: #wait, at_least: #at_least, at_most: #at_most })
}

/// A return edge that never runs, typed as the fn's return type: the body's `?` and `return`
/// infer against it, and a mismatch is blamed on the signature (tracing does so).
fn fake_return_edge(body_ret: &Type, ret_span: Span) -> TokenStream {
    if contains_impl_trait(body_ret) {
        quote!()
    } else {
        let ret = body_ret;
        quote_spanned! {ret_span=>
            #[allow(
                unknown_lints,
                unreachable_code,
                clippy::diverging_sub_expression,
                clippy::empty_loop,
                clippy::let_unit_value,
                clippy::needless_return
            )]
            if false {
                let __zklock_fake_return: #ret = loop {};
                return __zklock_fake_return;
            }
        }
    }
}

/// `Duration::from_secs(n)` for whole seconds, else `Duration::from_millis(n)`.
fn duration(millis: u64) -> TokenStream {
    if millis.is_multiple_of(1000) {
        let secs = proc_macro2::Literal::u64_unsuffixed(millis / 1000);
        quote!(::core::time::Duration::from_secs(#secs))
    } else {
        let millis = proc_macro2::Literal::u64_unsuffixed(millis);
        quote!(::core::time::Duration::from_millis(#millis))
    }
}

/// The same tokens, every one at `span`.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tt| {
            if let proc_macro2::TokenTree::Group(group) = &tt {
                let mut inner =
                    proc_macro2::Group::new(group.delimiter(), respan(group.stream(), span));
                inner.set_span(span);
                tt = inner.into();
            } else {
                tt.set_span(span);
            }
            tt
        })
        .collect()
}

/// Whether a type mentions `impl Trait`, which cannot annotate a `let`.
fn contains_impl_trait(ty: &Type) -> bool {
    fn any_impl(tokens: TokenStream) -> bool {
        tokens.into_iter().any(|tt| match tt {
            proc_macro2::TokenTree::Ident(ident) => ident == "impl",
            proc_macro2::TokenTree::Group(group) => any_impl(group.stream()),
            _ => false,
        })
    }
    any_impl(ty.to_token_stream())
}
