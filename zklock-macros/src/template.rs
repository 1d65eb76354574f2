//! Key templates: `"user_{id}"`, `"order_{order.user_id}"`, `"user_<id>"`.
//!
//! Scanned like thiserror scans `#[error("... {field}")]` (impl/src/fmt.rs): the literal is split
//! into text and placeholders, each placeholder is a parameter name optionally followed by
//! `.field` or `.0` accesses, and `{{ }} << >>` stand for the literal characters.

/// One piece of a key template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Segment {
    /// Literal text (escapes already resolved).
    Text(String),
    /// A placeholder: `root` is a parameter name (or `self`), `fields` the accesses after it.
    Value {
        root: Name,
        fields: Vec<Name>,
        /// The placeholder as written, for messages: `{order.user_id}`.
        written: String,
    },
}

/// A name inside a placeholder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Name {
    /// An identifier; `raw` for `r#type`.
    Ident { name: String, raw: bool },
    /// A tuple field: `.0`.
    Index(u32),
}

impl Name {
    /// The name as it would be written in Rust.
    pub(crate) fn as_written(&self) -> String {
        match self {
            Name::Ident { name, raw: true } => format!("r#{name}"),
            Name::Ident { name, raw: false } => name.clone(),
            Name::Index(i) => i.to_string(),
        }
    }
}

/// Splits a template into segments, or says what is wrong with it.
pub(crate) fn parse(template: &str) -> Result<Vec<Segment>, String> {
    let mut segments = Vec::new();
    let mut text = String::new();
    let mut chars = template.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        let close = match c {
            '{' => '}',
            '<' => '>',
            '}' | '>' => {
                if chars.peek().map(|&(_, n)| n) == Some(c) {
                    chars.next();
                    text.push(c);
                    continue;
                }
                return Err(format!(
                    "unmatched `{c}` in the key template; write `{c}{c}` for a literal `{c}`"
                ));
            }
            _ => {
                text.push(c);
                continue;
            }
        };
        if chars.peek().map(|&(_, n)| n) == Some(c) {
            chars.next();
            text.push(c);
            continue;
        }
        let body_start = start + c.len_utf8();
        let mut end = None;
        for (i, n) in chars.by_ref() {
            if n == close {
                end = Some(i);
                break;
            }
        }
        let Some(end) = end else {
            return Err(format!(
                "unclosed `{c}` in the key template; close the placeholder with `{close}`, or write `{c}{c}` for a literal `{c}`"
            ));
        };
        let written = &template[start..end + close.len_utf8()];
        let (root, fields) = placeholder(&template[body_start..end], written)?;
        if !text.is_empty() {
            segments.push(Segment::Text(std::mem::take(&mut text)));
        }
        segments.push(Segment::Value {
            root,
            fields,
            written: written.to_string(),
        });
    }
    if !text.is_empty() {
        segments.push(Segment::Text(text));
    }
    if segments.is_empty() {
        return Err("the key template is empty; give a name such as \"user_{id}\"".into());
    }
    Ok(segments)
}

/// Parses the inside of a placeholder: `id`, `order.user_id`, `pair.0`, `self.id`.
fn placeholder(inner: &str, written: &str) -> Result<(Name, Vec<Name>), String> {
    if inner.is_empty() {
        return Err(format!(
            "empty placeholder `{written}`; name a parameter of the fn, as in \"user_{{id}}\""
        ));
    }
    if inner.contains(':') {
        return Err(format!(
            "format specs are not supported in `{written}`: the key uses the value's Display; format it into a parameter first"
        ));
    }
    let mut parts = inner.split('.');
    let root = parts.next().unwrap_or_default();
    let root = match ident(root) {
        Some(name) => name,
        None if root.chars().all(|c| c.is_ascii_digit()) => {
            return Err(format!(
                "positional placeholder `{written}`: name a parameter of the fn instead, as in \"user_{{id}}\""
            ))
        }
        None => {
            return Err(format!(
                "`{written}` is not a placeholder: write a parameter name, optionally followed by fields, as in `{{order.user_id}}`"
            ))
        }
    };
    let mut fields = Vec::new();
    for part in parts {
        if let Some(name) = ident(part) {
            fields.push(name);
        } else if !part.is_empty()
            && part.chars().all(|c| c.is_ascii_digit())
            && (part == "0" || !part.starts_with('0'))
        {
            let index = part
                .parse()
                .map_err(|_| format!("tuple index too large in `{written}`"))?;
            fields.push(Name::Index(index));
        } else {
            return Err(format!(
                "`{written}` is not a placeholder: after a `.` comes a field name or a tuple index, as in `{{order.user_id}}` or `{{pair.0}}`"
            ));
        }
    }
    Ok((root, fields))
}

/// An identifier, raw (`r#type`) or not.
fn ident(s: &str) -> Option<Name> {
    let (name, raw) = match s.strip_prefix("r#") {
        Some(rest) => (rest, true),
        None => (s, false),
    };
    let mut chars = name.chars();
    let first = chars.next()?;
    if !(first == '_' || first.is_alphabetic()) || !chars.all(|c| c == '_' || c.is_alphanumeric()) {
        return None;
    }
    if name == "_" {
        return None;
    }
    Some(Name::Ident {
        name: name.to_string(),
        raw,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> Name {
        Name::Ident {
            name: name.into(),
            raw: false,
        }
    }

    fn value(root: &str, fields: &[Name], written: &str) -> Segment {
        Segment::Value {
            root: id(root),
            fields: fields.to_vec(),
            written: written.into(),
        }
    }

    #[test]
    fn text_and_placeholders() {
        assert_eq!(
            parse("user_{id}").unwrap(),
            vec![Segment::Text("user_".into()), value("id", &[], "{id}")]
        );
        assert_eq!(
            parse("{order.user_id}-{pair.0}!").unwrap(),
            vec![
                value("order", &[id("user_id")], "{order.user_id}"),
                Segment::Text("-".into()),
                value("pair", &[Name::Index(0)], "{pair.0}"),
                Segment::Text("!".into()),
            ]
        );
        assert_eq!(
            parse("user_<id>").unwrap(),
            vec![Segment::Text("user_".into()), value("id", &[], "<id>")]
        );
        assert_eq!(
            parse("nightly").unwrap(),
            vec![Segment::Text("nightly".into())]
        );
        assert_eq!(
            parse("{self.id}").unwrap(),
            vec![value("self", &[id("id")], "{self.id}")]
        );
        assert_eq!(
            parse("{r#type}").unwrap(),
            vec![Segment::Value {
                root: Name::Ident {
                    name: "type".into(),
                    raw: true
                },
                fields: vec![],
                written: "{r#type}".into()
            }]
        );
    }

    #[test]
    fn escapes() {
        assert_eq!(
            parse("a{{b}}<<c>>").unwrap(),
            vec![Segment::Text("a{b}<c>".into())]
        );
        assert_eq!(
            parse("{{{id}}}").unwrap(),
            vec![
                Segment::Text("{".into()),
                value("id", &[], "{id}"),
                Segment::Text("}".into())
            ]
        );
    }

    #[test]
    fn errors_say_what_to_write() {
        for (template, needle) in [
            ("", "empty"),
            ("user_{id", "unclosed `{`"),
            ("user_<id", "unclosed `<`"),
            ("user_{id>", "unclosed `{`"),
            ("user_}", "unmatched `}`"),
            ("a->b", "unmatched `>`"),
            ("{}", "empty placeholder"),
            ("{0}", "positional"),
            ("{id:?}", "format specs"),
            ("{id:>8}", "format specs"),
            ("<a{b>", "not a placeholder"),
            ("{a b}", "not a placeholder"),
            ("{a.}", "not a placeholder"),
            ("{a.01}", "not a placeholder"),
            ("{_}", "not a placeholder"),
            ("{a-b}", "not a placeholder"),
        ] {
            let err = parse(template).unwrap_err();
            assert!(err.contains(needle), "{template:?}: {err}");
        }
    }
}
