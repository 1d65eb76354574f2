//! The attribute's arguments: `"key template", mode = "...", timeout = "...", manager = expr,
//! on_lost = "...", crate = "..."`, and the job options `skip_if_locked, at_least = "...",
//! at_most = "..."`.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::{Expr, Ident, LitStr, Path, Token};

mod kw {
    syn::custom_keyword!(mode);
    syn::custom_keyword!(timeout);
    syn::custom_keyword!(manager);
    syn::custom_keyword!(on_lost);
    syn::custom_keyword!(skip_if_locked);
    syn::custom_keyword!(at_least);
    syn::custom_keyword!(at_most);
}

const OPTIONS: &str =
    "`mode`, `timeout`, `manager`, `on_lost`, `crate`, `skip_if_locked`, `at_least` or `at_most`";
const JOB_OPTIONS: &str = "`skip_if_locked`, `at_least` or `at_most`";

/// The parsed arguments of `#[distributed_lock(...)]`.
pub(crate) struct Args {
    /// The key template, as written.
    pub(crate) key: LitStr,
    pub(crate) mode: Option<Mode>,
    /// The wait timeout in milliseconds.
    pub(crate) timeout: Option<u64>,
    pub(crate) manager: Option<Expr>,
    pub(crate) on_lost: Option<OnLost>,
    /// `crate = "..."`: the path of the zklock crate (default `::zklock`).
    pub(crate) krate: Option<Path>,
    /// `skip_if_locked`: where it was written.
    pub(crate) skip_if_locked: Option<Span>,
    /// `at_least = "..."` in milliseconds.
    pub(crate) at_least: Option<u64>,
    /// `at_most = "..."` in milliseconds.
    pub(crate) at_most: Option<u64>,
    /// Where options were written, for errors about combinations.
    spans: Spans,
}

/// The tokens that errors about combinations of options point at.
#[derive(Default)]
struct Spans {
    /// The `timeout` name.
    timeout: Option<Span>,
    /// The `mode` value.
    mode: Option<Span>,
    /// The `on_lost` value.
    on_lost: Option<Span>,
    /// The `at_least` name.
    at_least: Option<Span>,
    /// The `at_most` name.
    at_most: Option<Span>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Exclusive,
    Read,
    Write,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnLost {
    Abort,
    Continue,
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Args> {
        if input.is_empty() {
            return Err(syn::Error::new(
                Span::call_site(),
                "missing the key template: write #[distributed_lock(\"user_{id}\")], naming the fn's parameters in braces",
            ));
        }
        if !input.peek(LitStr) {
            return Err(input.error(
                "expected the key template as a string literal first, as in #[distributed_lock(\"user_{id}\")]",
            ));
        }
        let mut args = Args {
            key: input.parse()?,
            mode: None,
            timeout: None,
            manager: None,
            on_lost: None,
            krate: None,
            skip_if_locked: None,
            at_least: None,
            at_most: None,
            spans: Spans::default(),
        };
        while !input.is_empty() {
            input.parse::<Token![,]>()?;
            if input.is_empty() {
                break;
            }
            args.parse_option(input)?;
        }
        args.check_job()?;
        Ok(args)
    }
}

impl Args {
    /// Whether the fn runs as a scheduled job (`LockManager::job`): any job option is given.
    pub(crate) fn is_job(&self) -> bool {
        self.skip_if_locked.is_some() || self.at_least.is_some() || self.at_most.is_some()
    }

    /// The combinations a job refuses, all reported together.
    fn check_job(&self) -> syn::Result<()> {
        if !self.is_job() {
            return Ok(());
        }
        let mut errors: Vec<syn::Error> = Vec::new();
        if let (Some(_), Some(timeout)) = (self.skip_if_locked, self.spans.timeout) {
            errors.push(syn::Error::new(
                timeout,
                "`timeout` and `skip_if_locked` contradict each other: a job that skips when another instance holds it does not wait; keep one",
            ));
        }
        if self.skip_if_locked.is_none() && self.timeout.is_none() {
            for (name, span) in [
                ("at_least", self.spans.at_least),
                ("at_most", self.spans.at_most),
            ] {
                if let Some(span) = span {
                    errors.push(syn::Error::new(
                        span,
                        format!("`{name}` makes this fn a job: say what a call does when another instance holds it, with `skip_if_locked` (return at once, skipped) or `timeout = \"5s\"` (wait that long, then skip)"),
                    ));
                }
            }
        }
        if let (Some(mode @ (Mode::Read | Mode::Write)), Some(span)) = (self.mode, self.spans.mode)
        {
            let mode = if mode == Mode::Read { "read" } else { "write" };
            errors.push(syn::Error::new(
                span,
                format!("a job holds an exclusive lock: `mode = \"{mode}\"` cannot go with {JOB_OPTIONS}"),
            ));
        }
        if let (Some(OnLost::Continue), Some(span)) = (self.on_lost, self.spans.on_lost) {
            errors.push(syn::Error::new(
                span,
                format!("a job's body is stopped when its hold is lost or runs past `at_most`: `on_lost = \"continue\"` cannot go with {JOB_OPTIONS}"),
            ));
        }
        let mut errors = errors.into_iter();
        match errors.next() {
            None => Ok(()),
            Some(mut first) => {
                errors.for_each(|err| first.combine(err));
                Err(first)
            }
        }
    }

    fn parse_option(&mut self, input: ParseStream<'_>) -> syn::Result<()> {
        let lookahead = input.lookahead1();
        if lookahead.peek(kw::mode) {
            let name = input.parse::<kw::mode>()?;
            once(&self.mode, &name, "mode")?;
            let lit = value::<LitStr>(input, "mode = \"read\"")?;
            self.spans.mode = Some(lit.span());
            self.mode = Some(mode_of(&lit)?);
        } else if lookahead.peek(kw::timeout) {
            let name = input.parse::<kw::timeout>()?;
            once(&self.timeout, &name, "timeout")?;
            let lit = value::<LitStr>(input, "timeout = \"5s\"")?;
            let millis = parse_duration("timeout", &lit.value())
                .map_err(|msg| syn::Error::new_spanned(&lit, msg))?;
            self.timeout = Some(millis);
            self.spans.timeout = Some(name.span);
        } else if lookahead.peek(kw::manager) {
            let name = input.parse::<kw::manager>()?;
            once(&self.manager, &name, "manager")?;
            input.parse::<Token![=]>()?;
            self.manager = Some(input.parse()?);
        } else if lookahead.peek(kw::on_lost) {
            let name = input.parse::<kw::on_lost>()?;
            once(&self.on_lost, &name, "on_lost")?;
            let lit = value::<LitStr>(input, "on_lost = \"continue\"")?;
            self.spans.on_lost = Some(lit.span());
            self.on_lost = Some(on_lost_of(&lit)?);
        } else if lookahead.peek(Token![crate]) {
            let name = input.parse::<Token![crate]>()?;
            once(&self.krate, &name, "crate")?;
            let lit = value::<LitStr>(input, "crate = \"my_zklock\"")?;
            self.krate = Some(crate_path(&lit)?);
        } else if lookahead.peek(kw::skip_if_locked) {
            let name = input.parse::<kw::skip_if_locked>()?;
            once(&self.skip_if_locked, &name, "skip_if_locked")?;
            no_value(
                input,
                "`skip_if_locked` takes no value: write `skip_if_locked` alone",
            )?;
            self.skip_if_locked = Some(name.span);
        } else if lookahead.peek(kw::at_least) {
            let name = input.parse::<kw::at_least>()?;
            once(&self.at_least, &name, "at_least")?;
            self.at_least = Some(window(input, "at_least", "no other run starts within that long of a run's start; give a duration longer than zero, or leave the option out")?);
            self.spans.at_least = Some(name.span);
        } else if lookahead.peek(kw::at_most) {
            let name = input.parse::<kw::at_most>()?;
            once(&self.at_most, &name, "at_most")?;
            self.at_most = Some(window(input, "at_most", "every run would be stopped at once; give a duration longer than zero, or leave the option out")?);
            self.spans.at_most = Some(name.span);
        } else if input.peek(Ident::peek_any) {
            let name = input.call(Ident::parse_any)?;
            return Err(syn::Error::new_spanned(
                &name,
                format!("unknown option `{name}`; expected {OPTIONS}"),
            ));
        } else {
            return Err(lookahead.error());
        }
        Ok(())
    }
}

/// The lock mode `lit` names.
fn mode_of(lit: &LitStr) -> syn::Result<Mode> {
    match lit.value().as_str() {
        "exclusive" => Ok(Mode::Exclusive),
        "read" => Ok(Mode::Read),
        "write" => Ok(Mode::Write),
        other => Err(syn::Error::new_spanned(
            lit,
            format!("unknown lock mode \"{other}\"; expected \"exclusive\", \"read\" or \"write\""),
        )),
    }
}

/// What `on_lost` `lit` names.
fn on_lost_of(lit: &LitStr) -> syn::Result<OnLost> {
    match lit.value().as_str() {
        "abort" => Ok(OnLost::Abort),
        "continue" => Ok(OnLost::Continue),
        other => Err(syn::Error::new_spanned(
            lit,
            format!("unknown on_lost \"{other}\"; expected \"abort\" or \"continue\""),
        )),
    }
}

/// The path of the zklock crate that `crate = "…"` names.
fn crate_path(lit: &LitStr) -> syn::Result<Path> {
    lit.parse::<Path>().map_err(|_| {
        syn::Error::new_spanned(
            lit,
            format!(
                "\"{}\" is not a path; name the zklock crate as your Cargo.toml renames it, as in crate = \"my_zklock\"",
                lit.value()
            ),
        )
    })
}

/// Refuses a value after a flag option (`= …`), with `err`, at the value.
fn no_value(input: ParseStream<'_>, err: &str) -> syn::Result<()> {
    if !input.peek(Token![=]) {
        return Ok(());
    }
    let eq = input.parse::<Token![=]>()?;
    let value = input.parse::<proc_macro2::TokenTree>().ok();
    Err(match value {
        Some(value) => syn::Error::new_spanned(value, err),
        None => syn::Error::new_spanned(eq, err),
    })
}

/// Refuses a second occurrence of an option, at its name.
fn once<T>(seen: &Option<T>, name: &impl quote::ToTokens, option: &str) -> syn::Result<()> {
    match seen {
        Some(_) => Err(syn::Error::new_spanned(
            name,
            format!("duplicate option `{option}`; give it once"),
        )),
        None => Ok(()),
    }
}

/// `= <literal>`, with an example of the expected form when the value is something else.
fn value<T: Parse>(input: ParseStream<'_>, example: &str) -> syn::Result<T> {
    input.parse::<Token![=]>()?;
    let span = input.span();
    input.parse::<T>().map_err(|_| {
        let mut err = syn::Error::new(span, format!("expected a string literal, as in {example}"));
        if let Ok(tt) = input.parse::<proc_macro2::TokenTree>() {
            err =
                syn::Error::new_spanned(tt, format!("expected a string literal, as in {example}"));
        }
        err
    })
}

/// `= "30s"` of `at_least` or `at_most`: a duration longer than zero, in milliseconds.
fn window(input: ParseStream<'_>, option: &str, zero: &str) -> syn::Result<u64> {
    let lit = value::<LitStr>(input, &format!("{option} = \"30s\""))?;
    match parse_duration(option, &lit.value()) {
        Ok(0) => Err(syn::Error::new_spanned(
            &lit,
            format!("`{option} = \"{}\"` is zero: {zero}", lit.value()),
        )),
        Ok(millis) => Ok(millis),
        Err(msg) => Err(syn::Error::new_spanned(&lit, msg)),
    }
}

/// Parses `"5s"`, `"500ms"`, `"1m30s"`, `"2h"` into milliseconds; `option` names the option
/// in errors.
pub(crate) fn parse_duration(option: &str, text: &str) -> Result<u64, String> {
    let bad = || {
        format!(
            "invalid {option} \"{text}\": write whole numbers with a unit (ms, s, m, h), as in \"5s\", \"500ms\" or \"1m30s\""
        )
    };
    let mut rest = text;
    let mut total: u64 = 0;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        if digits == 0 {
            return Err(bad());
        }
        let number: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let factor = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            _ => return Err(bad()),
        };
        rest = &rest[unit_len..];
        total = number
            .checked_mul(factor)
            .and_then(|ms| total.checked_add(ms))
            .ok_or_else(|| format!("{option} \"{text}\" is too long"))?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let parse_duration = |text| parse_duration("timeout", text);
        assert_eq!(parse_duration("5s"), Ok(5_000));
        assert_eq!(parse_duration("500ms"), Ok(500));
        assert_eq!(parse_duration("1m30s"), Ok(90_000));
        assert_eq!(parse_duration("2h"), Ok(7_200_000));
        assert_eq!(parse_duration("1s250ms"), Ok(1_250));
        assert_eq!(parse_duration("0ms"), Ok(0));
        for bad in ["", "5", "s", "5 s", "1.5s", "5secs", "-1s", "5S", "ms5"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_duration("99999999999999999h")
            .unwrap_err()
            .contains("too long"));
        assert!(super::parse_duration("at_least", "1 min")
            .unwrap_err()
            .starts_with("invalid at_least \"1 min\""));
    }

    fn parse(tokens: proc_macro2::TokenStream) -> syn::Result<Args> {
        syn::parse2(tokens)
    }

    #[test]
    fn options() {
        let args = parse(quote::quote!(
            "k_{id}",
            mode = "write",
            timeout = "2s",
            manager = self.locks,
            on_lost = "continue",
            crate = "::my_zklock",
        ))
        .unwrap();
        assert_eq!(args.key.value(), "k_{id}");
        assert_eq!(args.mode, Some(Mode::Write));
        assert_eq!(args.timeout, Some(2_000));
        assert!(args.manager.is_some());
        assert_eq!(args.on_lost, Some(OnLost::Continue));
        assert!(args.krate.unwrap().leading_colon.is_some());
    }

    #[test]
    fn bad_options() {
        let err = |tokens| parse(tokens).err().expect("accepted").to_string();
        assert!(err(quote::quote!()).contains("missing the key template"));
        assert!(err(quote::quote!(id)).contains("string literal first"));
        assert!(err(quote::quote!("k", mode = "shared")).contains("unknown lock mode"));
        assert!(err(quote::quote!("k", mode = read)).contains("mode = \"read\""));
        assert!(err(quote::quote!("k", timeout = 5)).contains("timeout = \"5s\""));
        assert!(err(quote::quote!("k", retries = 3)).contains("unknown option `retries`"));
        assert!(err(quote::quote!("k", timeout = "1s", timeout = "2s")).contains("duplicate"));
        assert!(err(quote::quote!("k", crate = "not a path")).contains("not a path"));
    }

    #[test]
    fn job_options() {
        let args = parse(quote::quote!(
            "k",
            skip_if_locked,
            at_least = "30s",
            at_most = "10m"
        ))
        .unwrap();
        assert!(args.is_job());
        assert!(args.skip_if_locked.is_some());
        assert_eq!(args.at_least, Some(30_000));
        assert_eq!(args.at_most, Some(600_000));
        let args = parse(quote::quote!(
            "k",
            timeout = "5s",
            at_least = "1m",
            mode = "exclusive",
            on_lost = "abort"
        ))
        .unwrap();
        assert!(args.is_job());
        assert!(!parse(quote::quote!("k", timeout = "5s")).unwrap().is_job());
    }

    #[test]
    fn bad_job_options() {
        let err = |tokens| parse(tokens).err().expect("accepted").to_string();
        assert!(err(quote::quote!("k", skip_if_locked = true)).contains("takes no value"));
        assert!(err(quote::quote!("k", skip_if_locked, skip_if_locked)).contains("duplicate"));
        assert!(err(quote::quote!("k", skip_if_locked, timeout = "1s")).contains("contradict"));
        assert!(err(quote::quote!("k", at_least = "30s")).contains("makes this fn a job"));
        assert!(err(quote::quote!("k", at_most = "1m")).contains("makes this fn a job"));
        assert!(err(quote::quote!("k", skip_if_locked, mode = "read")).contains("exclusive lock"));
        assert!(
            err(quote::quote!("k", skip_if_locked, on_lost = "continue")).contains("is stopped")
        );
        assert!(err(quote::quote!("k", skip_if_locked, at_least = "0s")).contains("is zero"));
        assert!(
            err(quote::quote!("k", skip_if_locked, at_most = "5 min")).contains("invalid at_most")
        );
        assert!(err(quote::quote!("k", skip_if_locked, at_most = 5)).contains("at_most = \"30s\""));
    }
}
